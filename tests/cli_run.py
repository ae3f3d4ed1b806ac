"""Run `kdt ARGS` in this process through kdt.cli.main: exit code, stdout, stderr (wide, unwrapped)."""

from __future__ import annotations

import sys

import pytest


def run_kdt_cli(monkeypatch, capsys, *args):
    import kdt.cli as cli
    from kdt import console as console_module

    monkeypatch.setattr(sys, "argv", ["kdt", *args])
    for console in (console_module.console, console_module.errors):
        monkeypatch.setattr(console, "_width", 250)
    with pytest.raises(SystemExit) as done:
        cli.main()
    captured = capsys.readouterr()
    return done.value.code, captured.out, captured.err

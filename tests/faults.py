"""Faults the hostile-input tests inject into kdt's file writing."""

from __future__ import annotations

import errno
import os

from kdt import golden


def fill_the_disk(monkeypatch) -> None:
    """From now on every array golden files write fails as on a full disk (ENOSPC)."""
    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(golden, "_write_array", disk_full)

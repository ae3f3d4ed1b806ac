"""The `kdt` command line (Typer): wires the commands of kdt/commands/ and turns errors into exit codes.

The command modules import what they need inside their commands, so `kdt --help` answers without loading numpy's
extensions, h5py, ml_dtypes or CuPy.
"""

from __future__ import annotations

import sys
from typing import Optional

import typer
from rich.markup import escape

import kdt
from kdt.commands import bench, env_check, fuzz, gen_golden, pipeline, plan, profile, sanitize, verify
from kdt.commands import build as build_command
from kdt.console import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_ENVIRONMENT, KdtExit, errors

app = typer.Typer(add_completion=False, no_args_is_help=True, context_settings={"help_option_names": ["-h", "--help"]},
                  help="kdt: write, prove and tune CUDA kernels for DDTree speculative decoding.")


def _version(show: bool) -> None:
    if show:
        print(f"kdt {kdt.__version__}")
        raise typer.Exit(0)


@app.callback()
def _options(version: Optional[bool] = typer.Option(None, "--version", callback=_version, is_eager=True,
                                                     help="print kdt's version and exit")) -> None:
    """kdt: write, prove and tune CUDA kernels for DDTree speculative decoding."""


app.command("env-check")(env_check.command)
app.command("gen-golden")(gen_golden.command)
app.command("build")(build_command.command)
app.command("plan")(plan.command)
app.command("profile")(profile.command)
app.command("verify")(verify.command)
app.command("bench")(bench.command)
app.command("pipeline")(pipeline.command)
app.command("fuzz")(fuzz.command)
app.command("sanitize")(sanitize.command)


def _is_usage_error(error: Exception) -> bool:
    """Click's usage errors, whether from click itself or the copy newer Typer releases vendor."""
    return hasattr(error, "show") and hasattr(error, "exit_code") and hasattr(error, "format_message")


def _exit_code(error: Exception) -> int | None:
    """The message and exit code of an error kdt expects (None: a bug, shown with its traceback). The error types
    are imported here, when one is raised, so that importing the CLI stays cheap."""
    from kdt import build, golden, runtime, stages, toolkit
    from kdt.refs.errors import BadInput

    if isinstance(error, (BadInput, stages.UnknownStage)):
        errors.print(f"[red]error:[/] {escape(str(error))}")
        return EXIT_BAD_INPUT
    if isinstance(error, golden.GoldenError):
        errors.print(f"[red]golden file error:[/] {escape(str(error))}")
        return EXIT_CHECK_FAILED
    if isinstance(error, build.BuildError):
        errors.print(f"[red]compile error[/] in {error.kernel} for {error.arch}:\n{escape(error.log)}")
        return EXIT_ENVIRONMENT
    if isinstance(error, (toolkit.ToolkitMissing, runtime.GpuMissing)):
        errors.print(f"[red]cannot run here:[/] {escape(str(error))}")
        return EXIT_ENVIRONMENT
    if isinstance(error, OSError):  # a read-only directory, a full disk: the file system said no
        errors.print(f"[red]file system error:[/] {escape(str(error))}")
        return EXIT_ENVIRONMENT
    if _is_usage_error(error):
        error.show()
        return EXIT_BAD_INPUT
    return None


def main() -> None:
    """Entry point: user mistakes end with a clear message and their exit code, never a traceback."""
    try:
        code = app(standalone_mode=False)
    except typer.Exit as done:
        code = done.exit_code
    except typer.Abort:
        errors.print("aborted")
        code = EXIT_BAD_INPUT
    except KdtExit as error:
        errors.print(error.message)
        code = error.code
    except Exception as error:
        code = _exit_code(error)
        if code is None:
            raise
    sys.exit(code or 0)

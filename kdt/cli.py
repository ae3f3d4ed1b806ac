"""The `kdt` command line (Typer): wires the commands of kdt/commands/ and turns errors into exit codes."""

from __future__ import annotations

import sys

import typer
from rich.markup import escape

from kdt import build, golden, runtime, stages, toolkit
from kdt.commands import bench, env_check, fuzz, gen_golden, pipeline, plan, sanitize, verify
from kdt.commands import build as build_command
from kdt.console import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_ENVIRONMENT, KdtExit, errors
from refs.errors import BadInput

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="kdt: write, prove and tune CUDA kernels for DDTree speculative decoding.")

app.command("env-check")(env_check.command)
app.command("gen-golden")(gen_golden.command)
app.command("build")(build_command.command)
app.command("plan")(plan.command)
app.command("verify")(verify.command)
app.command("bench")(bench.command)
app.command("pipeline")(pipeline.command)
app.command("fuzz")(fuzz.command)
app.command("sanitize")(sanitize.command)


def _is_usage_error(error: Exception) -> bool:
    """Click's usage errors, whether from click itself or the copy newer Typer releases vendor."""
    return hasattr(error, "show") and hasattr(error, "exit_code") and hasattr(error, "format_message")


def main() -> None:
    """Entry point: user mistakes end with a clear message and their exit code, never a traceback."""
    try:
        code = app(standalone_mode=False)
    except typer.Exit as done:
        code = done.exit_code
    except typer.Abort:
        errors.print("aborted")
        code = EXIT_BAD_INPUT
    except (BadInput, stages.UnknownStage) as error:
        errors.print(f"[red]error:[/] {escape(str(error))}")
        code = EXIT_BAD_INPUT
    except golden.GoldenError as error:
        errors.print(f"[red]golden file error:[/] {escape(str(error))}")
        code = EXIT_CHECK_FAILED
    except KdtExit as error:
        errors.print(error.message)
        code = error.code
    except build.BuildError as error:
        errors.print(f"[red]compile error[/] in {error.kernel} for {error.arch}:\n{escape(error.log)}")
        code = EXIT_ENVIRONMENT
    except (toolkit.ToolkitMissing, runtime.GpuMissing) as error:
        errors.print(f"[red]cannot run here:[/] {escape(str(error))}")
        code = EXIT_ENVIRONMENT
    except OSError as error:  # a read-only directory, a full disk: the file system said no
        errors.print(f"[red]file system error:[/] {escape(str(error))}")
        code = EXIT_ENVIRONMENT
    except Exception as error:
        if not _is_usage_error(error):
            raise
        error.show()
        code = EXIT_BAD_INPUT
    sys.exit(code or 0)

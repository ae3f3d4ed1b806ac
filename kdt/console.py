"""One rich console for kdt's output, and the exit codes every command shares."""

from __future__ import annotations

from rich.console import Console

EXIT_OK = 0            # everything checked passed
EXIT_CHECK_FAILED = 1  # a mismatch, a drift, a regression, a failed requirement
EXIT_ENVIRONMENT = 2   # this machine cannot run it: no GPU, no nvcc, no CuPy, a compile error in a kernel
EXIT_BAD_INPUT = 3     # the user's arguments or files are not what the command takes

console = Console(highlight=False)
errors = Console(stderr=True, highlight=False)


class KdtExit(Exception):
    """Ends a command with a message and an exit code, without a traceback."""

    def __init__(self, code: int, message: str):
        self.code, self.message = code, message
        super().__init__(message)

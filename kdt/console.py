"""Where kdt's output goes and how it fits there, and the exit codes every command shares.

One place decides the width: on a terminal rich uses the terminal's width and a table that does not fit folds its
cells onto more lines; anywhere else (a CI log, a file, a pipe) the console is UNBOUNDED_WIDTH columns wide, so every
table keeps its natural width and no line is wrapped at 80 (whatever $COLUMNS says). No table column ever cuts a cell with "…": every command builds its tables with
`Sheet`, whose cells are plain text (never parsed as markup) and whose columns fold.

`Report` is what a command reports through: `--format table` (rich, the default), `markdown` (GitHub-flavoured
tables on stdout) or `json` (one document on stdout, the prose on stderr). It keeps everything said as markdown, so
`step_summary()` can append it to $GITHUB_STEP_SUMMARY whatever the format.
"""

from __future__ import annotations

import enum
import json
import os
import re
import shlex
import sys
from typing import Iterable, Sequence, Union

from rich.console import Console, ConsoleDimensions
from rich.table import Table
from rich.text import Text

EXIT_OK = 0            # everything checked passed
EXIT_CHECK_FAILED = 1  # a mismatch, a drift, a regression, a failed requirement
EXIT_ENVIRONMENT = 2   # this machine cannot run it: no GPU, no nvcc, no CuPy, a compile error in a kernel
EXIT_BAD_INPUT = 3     # the user's arguments or files are not what the command takes

UNBOUNDED_WIDTH = 4096  # the width off a terminal: wider than any table kdt prints, so each keeps its natural width


def _on_a_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):   # no isatty, or a closed file
        return False


class _Console(Console):
    """A rich console whose width off a terminal is UNBOUNDED_WIDTH (rich would take 80 or $COLUMNS and cut cells);
    a width set explicitly (console.width = N) still wins."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        if self._width is None and not _on_a_terminal(self.file):
            return ConsoleDimensions(UNBOUNDED_WIDTH, size.height)
        return size

    @size.setter
    def size(self, new_size) -> None:
        self._width, self._height = new_size


console = _Console(highlight=False, emoji=False)
errors = _Console(stderr=True, highlight=False, emoji=False)


class KdtExit(Exception):
    """Ends a command with a message and an exit code, without a traceback."""

    def __init__(self, code: int, message: str):
        self.code, self.message = code, message
        super().__init__(message)


# --- tables ---------------------------------------------------------------------------------------------

Cell = Union[str, Text, None]


def styled(text: str, style: str) -> Text:
    """A table cell in colour (`styled("FAIL", "red")`); the text is taken as is, never as markup."""
    return Text(text, style=style)


def _cell(value: Cell) -> Text:
    if value is None:
        return Text("")
    return value if isinstance(value, Text) else Text(str(value))


def md_escape(text: str) -> str:
    """Text for one markdown table cell or line: pipes escaped, no raw HTML (a `<` that could open a tag or a
    comment becomes `&lt;`; `<=` and `a < b` stay readable in a log), one line."""
    text = text.replace("\\", "\\\\").replace("|", "\\|")
    text = re.sub(r"<(?=[A-Za-z/!?])", "&lt;", text)
    return text.replace("\r\n", "\n").replace("\n", "<br>")


class Sheet:
    """A titled table of plain cells that renders as a rich Table (print it) or as a GitHub markdown table.

    Every command's tables are Sheets: a str cell is shown exactly as given (markup is not interpreted, so a
    path or an error message needs no escaping), a rich Text (`styled`) adds colour, and every column folds
    instead of cutting, so no name is ever shortened to "…"."""

    def __init__(self, title: str, columns: Sequence[str], *, right: Iterable[str] = (), show_header: bool = True):
        self.title = title
        self.columns = list(columns)
        self.right = set(right)
        self.show_header = show_header
        self.rows: list[list[Text]] = []

    def add_row(self, *cells: Cell) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{self.title}: {len(cells)} cells for {len(self.columns)} columns")
        self.rows.append([_cell(value) for value in cells])

    def __rich__(self) -> Table:
        table = Table(title=Text(self.title, style="table.title"), show_header=self.show_header)
        for name in self.columns:
            table.add_column(Text(name), justify="right" if name in self.right else "left", overflow="fold")
        for row in self.rows:
            table.add_row(*row)
        return table

    def markdown(self) -> str:
        """`**title**`, a blank line, the header row, the separator row (`---:` right-aligned), one row a row."""
        lines = [f"**{md_escape(self.title)}**", "",
                 "| " + " | ".join(md_escape(name) for name in self.columns) + " |",
                 "| " + " | ".join("---:" if name in self.right else "---" for name in self.columns) + " |"]
        lines += ["| " + " | ".join(md_escape(cell.plain) for cell in row) + " |" for row in self.rows]
        return "\n".join(lines)


# --- reports --------------------------------------------------------------------------------------------

class OutputFormat(str, enum.Enum):
    """--format: rich tables for people, markdown for CI pages, JSON for tools."""

    table = "table"
    markdown = "markdown"
    json = "json"


def command_line(command: str) -> str:
    """`kdt build topk --arch sm_120`: the command as run when this process runs it, else `kdt COMMAND`."""
    args = sys.argv[1:]
    return "kdt " + (shlex.join(args) if args[:1] == [command] else command)


def _fence(lines: Sequence[str]) -> str:
    fence = "```"
    while any(fence in line for line in lines):
        fence += "`"
    return "\n".join([fence + "text", *lines, fence])


class Report:
    """A command's findings, in the --format asked for, and kept as markdown for the GitHub step summary.

    table: tables and prose through the rich console; markdown: tables and prose as markdown on stdout (under a
    title line with the command); json: only `document()` on stdout, the prose on stderr. Progress and live
    tables never come here: they go to stderr (`errors`)."""

    def __init__(self, command: str, output: Union[OutputFormat, str] = OutputFormat.table):
        self.command = command
        self.format = OutputFormat(output)
        self.title = f"### `{command_line(command)}`"
        self.blocks: list[str] = []   # everything reported, as markdown
        self._printed = False

    def _markdown_out(self, block: str) -> None:
        if self.format is OutputFormat.markdown:
            sys.stdout.write(("" if self._printed else self.title + "\n\n") + block + "\n\n")
            sys.stdout.flush()
            self._printed = True

    def table(self, sheet: Sheet) -> None:
        block = sheet.markdown()
        self.blocks.append(block)
        if self.format is OutputFormat.table:
            console.print(sheet)
        self._markdown_out(block)

    def say(self, markup: str) -> None:
        """A line of prose in rich markup (escape what came from a user or a file)."""
        block = md_escape(Text.from_markup(markup).plain)
        self.blocks.append(block)
        if self.format is OutputFormat.table:
            console.print(markup)
        elif self.format is OutputFormat.json:
            errors.print(markup)
        self._markdown_out(block)

    def verbatim(self, lines: Sequence[str], prefix: str = "  ") -> None:
        """Lines quoted as they are (a log, a tool's findings): indented on the console, a code block in markdown."""
        if not lines:
            return
        block = _fence(lines)
        self.blocks.append(block)
        if self.format is not OutputFormat.markdown:
            target = console if self.format is OutputFormat.table else errors
            for line in lines:
                target.print(prefix + line, markup=False)
        self._markdown_out(block)

    def document(self, payload: Union[dict, list, str]) -> None:
        """The JSON document of --format json (a dict, or text that already is JSON); nothing otherwise."""
        if self.format is OutputFormat.json:
            text = payload if isinstance(payload, str) else json.dumps(payload, indent=2, default=str)
            sys.stdout.write(text.rstrip("\n") + "\n")
            sys.stdout.flush()

    def markdown(self, *closing: str) -> str:
        """The title line with the command, then everything reported, then `closing` lines (markup)."""
        tail = [md_escape(Text.from_markup(line).plain) for line in closing]
        return "\n\n".join([self.title, *self.blocks, *tail]) + "\n"

    def step_summary(self, *closing: str) -> None:
        """Append markdown() to the file $GITHUB_STEP_SUMMARY names, if it names one; a failure is a warning."""
        path = os.environ.get("GITHUB_STEP_SUMMARY", "")
        if path:
            append_step_summary(path, self.markdown(*closing))


def append_step_summary(path: str, text: str) -> bool:
    """Append `text` to the step summary at `path` (after a blank line where it already holds something); never
    raises: a failure is a warning on stderr, and the command's exit code stays what it was."""
    try:
        with open(path, "ab+") as summary:
            size = summary.seek(0, os.SEEK_END)
            separator = b""
            if size:
                summary.seek(size - 1)
                separator = b"\n" if summary.read(1) == b"\n" else b"\n\n"
            summary.write(separator + text.encode("utf-8"))
        return True
    except (OSError, ValueError) as error:
        from rich.markup import escape

        errors.print(f"[yellow]warning:[/] could not append to GITHUB_STEP_SUMMARY ({escape(path)}): "
                     f"{escape(str(error))}")
        return False

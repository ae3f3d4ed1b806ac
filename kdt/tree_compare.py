"""`kdt bench --against REV --whole-trees`: another revision timed by its own kdt (its launchers, knobs, constants and
kernels) in separate processes that alternate with this tree's, round by round, on the same GPU. For the builds that
--against cannot drive in one process, because a kernel argument, a launch constant or a knob changed between them.

Each round runs `kdt bench ... --no-baselines --format json` once in each tree (the order alternates: ours first in
even rounds), and a shape's ratio is the median over rounds of ours / theirs, each run already the median of its own
timed launches. A tree that refuses the arguments (exit 3: e.g. a knob the other revision lacks) stops the comparison
as bad input; one that cannot run (exit 2), fails otherwise or runs past CHILD_TIMEOUT_S stops it with exit 2. Either
way with that tree's last words.

Each tree's process allocates and launches on its own: on a kernel of a few microseconds, SASS identical but for its
parameter offsets has read 1.025 this way (plans/perf-notes.md, twenty-sixth session), so a difference of a few
percent there wants the in-process --against (same launcher, interleaved) before it is read as the code's.
"""

from __future__ import annotations

import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from kdt.console import EXIT_BAD_INPUT, EXIT_ENVIRONMENT, KdtExit
from kdt.refs.errors import BadInput

ROUNDS = 3
CHILD_TIMEOUT_S = 3600


@dataclass
class TreeComparison:
    kernel: str
    shape: str
    arch: str
    knobs: dict
    mode: str                                  # the headline's: graph or eager (ours)
    path: str                                  # ours; theirs where it differs: "ours / theirs"
    ours_us: list[float] = field(default_factory=list)     # the headline of each round
    theirs_us: list[float] = field(default_factory=list)

    @property
    def ratios(self) -> list[float]:
        return [a / b for a, b in zip(self.ours_us, self.theirs_us)]

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios)


def export_revision(repository: Path, revision: str, into: Path, *members: str, expected: str) -> None:
    """`git archive REV [members]` of `repository`, extracted into `into`. BadInput naming --against where git cannot
    run or the revision is not there (`expected`: what the argument should have named)."""
    try:
        archive = subprocess.run(["git", "-C", str(repository), "archive", revision, *members], capture_output=True,
                                 timeout=300)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise BadInput("--against", "a git revision of this checkout (git must run)", f"{revision} ({error})") from None
    if archive.returncode != 0:
        raise BadInput("--against", expected, f"{revision} ({archive.stderr.decode(errors='replace').strip()[:200]})")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")


def tree_of(revision: str, repository: Path, into: Path) -> Path:
    """The source tree to run: a directory holding kdt/ and kernels/, or `git archive REV` of `repository` extracted
    into `into`. BadInput naming --against otherwise."""
    given = Path(revision)
    if given.is_dir():
        if not ((given / "kdt" / "__main__.py").is_file() and any((given / "kernels").glob("*.cu"))):
            raise BadInput("--against", "with --whole-trees, a git revision or a checkout (kdt/ and kernels/)",
                           revision)
        return given.resolve()
    export_revision(repository, revision, into, expected=f"a git revision of {repository}")
    if not (into / "kdt" / "__main__.py").is_file():
        raise BadInput("--against", "a revision that has kdt/ (kdt bench)", revision)
    return into


def bench_arguments(stages: Sequence[str], shape_set: Optional[str], quick: bool, shape: Optional[str],
                    knobs: Sequence[str], sweep: Optional[str], arches: Sequence[str], sms: Optional[int],
                    no_graph: bool) -> list[str]:
    """The `python -m kdt bench` arguments both trees run: the same shapes, knobs and arches, JSON on stdout."""
    line = ["-m", "kdt", "bench", *stages, "--no-baselines", "--format", "json"]
    options = [("--set", shape_set), ("--shape", shape), ("--sweep", sweep), ("--sms", sms)]
    options += [("--knob", item) for item in knobs] + [("--arch", item) for item in arches]
    line += [str(word) for option, value in options if value is not None for word in (option, value)]
    return line + (["--quick"] if quick else []) + (["--no-graph"] if no_graph else [])


Runner = Callable[..., "subprocess.CompletedProcess[str]"]


def run_tree(root: Optional[Path], arguments: Sequence[str], runner: Runner = subprocess.run) -> dict:
    """One `kdt bench` of the tree at `root` (None: this one, as installed) -> its JSON document. Its exit code 2 or
    3 stops the comparison (KdtExit, BadInput naming --against) with the last lines it printed."""
    env = dict(os.environ)
    if root is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
    which = "this tree" if root is None else f"the other tree ({root})"
    try:
        done = runner([sys.executable, *arguments], cwd=str(root) if root is not None else None, env=env,
                      capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise KdtExit(EXIT_ENVIRONMENT, f"kdt bench in {which} did not finish in {CHILD_TIMEOUT_S} s") from None
    said = " ".join((done.stderr or "").strip().splitlines()[-3:])[-400:]
    if done.returncode == EXIT_BAD_INPUT:
        raise BadInput("--against", "arguments both trees' kdt bench take", f"{which} refused them: {said}")
    if done.returncode != 0:
        raise KdtExit(EXIT_ENVIRONMENT, f"kdt bench in {which} stopped (exit {done.returncode}): {said}")
    try:
        return json.loads(done.stdout)
    except ValueError:
        raise KdtExit(EXIT_ENVIRONMENT, f"kdt bench in {which} printed no JSON document") from None


def _key(result: dict) -> tuple:
    return (result["kernel"], result["shape"], result.get("arch"),
            tuple(sorted((str(k), str(v)) for k, v in (result.get("knobs") or {}).items())))


def compare(ours: Sequence[dict], theirs: Sequence[dict]) -> tuple[list[TreeComparison], list[str]]:
    """Round documents of each tree -> a comparison per shape both timed in every round (in ours' order), and the
    shapes only one tree timed ("kernel shape")."""
    rows: dict[tuple, TreeComparison] = {}
    for document in ours:
        for r in document["results"]:
            row = rows.setdefault(_key(r), TreeComparison(r["kernel"], r["shape"], r.get("arch") or "-",
                                                          dict(r.get("knobs") or {}),
                                                          "graph" if r.get("graph") else "eager", r.get("path", "-")))
            row.ours_us.append(float(r["headline_us"]))
    paths: dict[tuple, str] = {}
    for document in theirs:
        for r in document["results"]:
            if _key(r) in rows:
                rows[_key(r)].theirs_us.append(float(r["headline_us"]))
                paths[_key(r)] = r.get("path", "-")
    for key, path in paths.items():
        if path != rows[key].path:
            rows[key].path = f"{rows[key].path} / {path}"
    both = [row for row in rows.values() if len(row.ours_us) == len(row.theirs_us) == len(ours)]
    theirs_keys = {_key(r) for document in theirs for r in document["results"]}
    lonely = [f"{row.kernel} {row.shape}" for row in rows.values() if row not in both]
    lonely += [f"{k[0]} {k[1]}" for k in sorted(theirs_keys - rows.keys())]
    return both, lonely


def rounds(other: Path, arguments: Sequence[str], count: int = ROUNDS, runner: Runner = subprocess.run,
           progress: Callable[[str], None] = lambda line: None) -> tuple[list[dict], list[dict]]:
    """`count` rounds of both trees' kdt bench, alternating which goes first -> (ours, theirs) documents."""
    ours, theirs = [], []
    for index in range(count):
        order = [(None, ours), (other, theirs)]
        for root, into in (order if index % 2 == 0 else order[::-1]):
            progress(f"round {index + 1} of {count}: {'this tree' if root is None else 'the other tree'}")
            into.append(run_tree(root, arguments, runner))
    return ours, theirs

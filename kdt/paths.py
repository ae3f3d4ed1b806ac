"""Where kdt finds its kernel sources and golden files: `kdt/kernels` and `kdt/golden_files`, which in a checkout are
links to the repository's `kernels/` and `golden/` (the layout the contract names) and in an installed wheel are the
package data itself. Both resolve against the package, never the working directory; so does the install command a
missing dependency's message gives (`install_command`)."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
# KDT_KERNELS_DIR points kdt at another tree of kernel sources (a fork under test, a broken one in tests)
KERNELS = Path(os.environ.get("KDT_KERNELS_DIR") or (PACKAGE / "kernels").resolve())
GOLDEN = (PACKAGE / "golden_files").resolve()


def install_command(extra: str | None = None) -> str:
    """The command that installs what kdt needs (extra None) or its optional `extra` ("gpu", "test", "plot") needs,
    for this installation: in a source checkout an editable install of it (its absolute path, so that it works from
    any directory), from an installed wheel those requirements as kdt's metadata lists them."""
    checkout = PACKAGE.parent
    if (checkout / "pyproject.toml").is_file():
        return f"python3 -m pip install -e '{checkout}" + (f"[{extra}]'" if extra else "'")
    from importlib import metadata

    from packaging.requirements import Requirement

    wanted = []
    for line in metadata.requires("kdt") or []:
        requirement = Requirement(line)
        marker, requirement.marker = requirement.marker, None
        # kdt's own requirements on this platform, or those that only the extra adds
        base = marker is None or marker.evaluate({"extra": ""})
        wanted_here = base if extra is None else (not base and marker.evaluate({"extra": extra}))
        if wanted_here:
            wanted.append(f"'{requirement}'")
    return "python3 -m pip install " + " ".join(wanted)

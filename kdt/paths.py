"""Where kdt finds its kernel sources and golden files: `kdt/kernels` and `kdt/golden_files`, which in a checkout are
links to the repository's `kernels/` and `golden/` (the layout the contract names) and in an installed wheel are the
package data itself. Both resolve against the package, never the working directory."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
# KDT_KERNELS_DIR points kdt at another tree of kernel sources (a fork under test, a broken one in tests)
KERNELS = Path(os.environ.get("KDT_KERNELS_DIR") or (PACKAGE / "kernels").resolve())
GOLDEN = (PACKAGE / "golden_files").resolve()

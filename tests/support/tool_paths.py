"""Paths tests grant hosted tools in their options: a tool runs as another user
when the tests run as root (`SandboxLimits.run_as`), so a granted path must be
that user's, as an operator's would be."""

from __future__ import annotations

import os
from pathlib import Path

from cluster.config import SandboxLimits


def owned_by_tools(path: Path, *, create_file: bool = False) -> str:
    """`path` given to the tools' user (when root runs the tests); a missing file
    is created first with `create_file`. Returns it as the option's text."""
    if create_file:
        path.touch()
    if os.geteuid() == 0:
        os.chown(path, *SandboxLimits().run_as)
    return str(path)

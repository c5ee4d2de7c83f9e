"""Installing a Debian package the embedded default needs (Redis; Prometheus for
the dashboards' tests) when its binary is missing: as root, or through `sudo -n`."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable


class PackageInstallError(RuntimeError):
    """The package could not be installed."""


def binary_or_install(binary: str, package: str, log: Callable[[str], None]) -> str:
    """The path of `binary`, installing `package` with apt-get first if it is missing."""
    found = shutil.which(binary)
    if found is not None:
        return found
    apt = shutil.which("apt-get")
    if apt is None:
        raise PackageInstallError(f"{binary} is not installed and apt-get is not available")
    log(f"installing Debian package {package}")
    prefix = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env_prefix = ["env", "DEBIAN_FRONTEND=noninteractive"]
    for command in ([apt, "update", "-q"], [apt, "install", "-y", "-q", package]):
        result = subprocess.run(prefix + env_prefix + command, capture_output=True, text=True)
        if result.returncode != 0:
            raise PackageInstallError(
                f"installing {package} failed ({' '.join(command)}): {result.stderr[-500:]}"
            )
    found = shutil.which(binary)
    if found is None:
        raise PackageInstallError(f"{binary} still missing after installing {package}")
    return found

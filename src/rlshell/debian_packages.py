"""Debian packages fetched into the project's own folders, the system left as it is.

`fetch_packages` runs ``apt-get download`` through a private sources list,
package lists and cache (the system's apt configuration, lists and installed
packages are not touched) and unpacks every package with ``dpkg -x`` into a
folder of its own. `rlshell.envs.vulkan` fetches Mesa's lavapipe this way and
`rlshell.isolation` bubblewrap.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["BOOKWORM", "BOOKWORM_BACKPORTS", "InstallError", "fetch_packages", "share_dir"]

_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
BOOKWORM = (
    f"deb [signed-by={_KEYRING}] http://deb.debian.org/debian bookworm main\n"
    f"deb [signed-by={_KEYRING}] http://deb.debian.org/debian bookworm-updates main\n"
    f"deb [signed-by={_KEYRING}] http://deb.debian.org/debian-security bookworm-security main\n"
)
BOOKWORM_BACKPORTS = (
    f"deb [signed-by={_KEYRING}] http://deb.debian.org/debian bookworm-backports main\n"
)


class InstallError(RuntimeError):
    """Packages could not be fetched here (no apt, no network, no such package)."""


def share_dir() -> Path:
    """``<venv>/share/rlstack``: where the project keeps the system parts it fetched."""
    return Path(sys.prefix) / "share" / "rlstack"


def fetch_packages(packages: tuple[str, ...], sources: str, work: Path) -> Path:
    """Download ``packages`` (``name`` or ``name/release``) from ``sources`` (a sources.list)
    into ``work`` and unpack them all into ``work / "root"``, which is returned.

    Raises `InstallError` with the reason when apt-get or dpkg is missing or a step fails.
    """
    for tool in ("apt-get", "dpkg"):
        if shutil.which(tool) is None:
            raise InstallError(f"{tool} is not on PATH (the package comes from Debian's archive)")
    for sub in ("lists/partial", "cache/archives/partial", "debs"):
        (work / sub).mkdir(parents=True)
    (work / "sources.list").write_text(sources)
    apt = [
        "apt-get",
        "-q",
        "-o",
        f"Dir::Etc::sourcelist={work / 'sources.list'}",
        "-o",
        "Dir::Etc::sourceparts=-",
        "-o",
        f"Dir::State::Lists={work / 'lists'}",
        "-o",
        f"Dir::Cache={work / 'cache'}",
        "-o",
        "Debug::NoLocking=1",
    ]
    _run([*apt, "update"], "apt-get update", work)
    _run([*apt, "download", *packages], "apt-get download", work / "debs")
    root = work / "root"
    for deb in sorted((work / "debs").glob("*.deb")):
        _run(["dpkg", "-x", str(deb), str(root)], f"dpkg -x {deb.name}", work)
    return root


def _run(command: list[str], what: str, cwd: Path) -> None:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise InstallError(f"{what} failed (exit {done.returncode}): {' / '.join(tail)}")

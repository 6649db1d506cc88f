"""A software Vulkan driver for ManiSkill on machines without a Vulkan GPU.

SAPIEN (ManiSkill's simulator) needs a Vulkan device even for state
observations. On a CPU machine Mesa's lavapipe provides one, but Debian 12's
own (Mesa 22.3) lacks a feature SAPIEN asks for (it answers `Failed to find a
supported physical device "cpu"`); Mesa 25's lavapipe from Debian's
bookworm-backports works. `install_lavapipe` fetches that build with
``apt-get download`` through a private sources list and package cache (the
system's apt configuration and packages are left as they are), unpacks it
with ``dpkg -x`` into ``<venv>/share/rlstack/vulkan`` and writes an ICD file
pointing at it. ``make install`` runs it (``python -m rlshell.envs.vulkan
install``) unless a Vulkan GPU driver is already installed.

`use_vulkan_driver` is what the ManiSkill env builder calls before SAPIEN
starts, in every process that builds an env: a driver the user chose
(``VK_ICD_FILENAMES`` / ``VK_DRIVER_FILES``) or the system's GPU driver is
kept; otherwise the installed lavapipe is selected (its newer libdrm loaded
first, since ``LD_LIBRARY_PATH`` cannot change once a process runs). A user
sets nothing.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import attrs

from rlshell.debian_packages import BOOKWORM_BACKPORTS, InstallError, fetch_packages

__all__ = [
    "DIR_ENV_VAR",
    "LAVAPIPE_PACKAGES",
    "DriverChoice",
    "InstallError",
    "default_driver_dir",
    "gpu_vulkan_drivers",
    "install_lavapipe",
    "installed_icd",
    "use_vulkan_driver",
]

# Mesa 25's lavapipe and the libdrm it was built against, from bookworm-backports.
LAVAPIPE_PACKAGES = (
    "mesa-vulkan-drivers/bookworm-backports",
    "libdrm2/bookworm-backports",
    "libdrm-amdgpu1/bookworm-backports",
)
_SYSTEM_ICD_DIRS = ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d")
# Software rasterisers among the system's drivers: not a Vulkan GPU.
_SOFTWARE_ICDS = ("lvp_icd", "swiftshader")
_LIB_DIR = Path("usr/lib/x86_64-linux-gnu")
# Loaded before the Vulkan loader opens lavapipe, which needs libdrm ≥ 2.4.121.
_PRELOAD = ("libdrm.so.2", "libdrm_amdgpu.so.1")
ICD_NAME = "lvp_icd.json"


DIR_ENV_VAR = "RLSTACK_VULKAN_DIR"


def default_driver_dir() -> Path:
    """Where lavapipe is installed: ``$RLSTACK_VULKAN_DIR``, else ``share/rlstack/vulkan`` in
    this Python's prefix (the project's venv, where ``make install`` puts it)."""
    chosen = os.environ.get(DIR_ENV_VAR)
    return Path(chosen) if chosen else Path(sys.prefix) / "share" / "rlstack" / "vulkan"


def installed_icd(driver_dir: Path | None = None) -> Path | None:
    """The installed lavapipe's ICD file, or None when it is not installed."""
    icd = (driver_dir or default_driver_dir()) / ICD_NAME
    return icd if icd.is_file() else None


def gpu_vulkan_drivers() -> list[str]:
    """The system's Vulkan ICD files for GPUs (software rasterisers left out)."""
    found = []
    for folder in _SYSTEM_ICD_DIRS:
        for path in sorted(glob.glob(f"{folder}/*.json")):
            if not any(soft in Path(path).name for soft in _SOFTWARE_ICDS):
                found.append(path)
    return found


@attrs.frozen
class DriverChoice:
    """Which Vulkan driver a process uses: ``kind`` is user, gpu, lavapipe or none."""

    kind: str
    detail: str


def use_vulkan_driver(driver_dir: Path | None = None) -> DriverChoice:
    """Select the Vulkan driver for SAPIEN in this process (see the module docstring).

    Call it before SAPIEN creates its Vulkan instance. Idempotent.
    """
    for variable in ("VK_ICD_FILENAMES", "VK_DRIVER_FILES"):
        chosen = os.environ.get(variable)
        if chosen and not chosen.startswith(str(driver_dir or default_driver_dir())):
            return DriverChoice("user", f"{variable}={chosen}")
    gpu_drivers = gpu_vulkan_drivers()
    if gpu_drivers and _has_gpu():
        return DriverChoice("gpu", ", ".join(gpu_drivers))
    icd = installed_icd(driver_dir)
    if icd is None:
        return DriverChoice(
            "none",
            "no Vulkan GPU driver and no software Vulkan driver (run `make install`, or "
            "`python -m rlshell.envs.vulkan install`, to fetch Mesa's lavapipe)",
        )
    lib_dir = icd.parent / _LIB_DIR
    for name in _PRELOAD:
        ctypes.CDLL(str(lib_dir / name), mode=ctypes.RTLD_GLOBAL)
    os.environ["VK_ICD_FILENAMES"] = str(icd)
    return DriverChoice("lavapipe", str(icd))


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def install_lavapipe(driver_dir: Path | None = None) -> Path:
    """Fetch and unpack Mesa 25's lavapipe into ``driver_dir``; return its ICD file.

    Raises `InstallError` with the reason when apt-get, dpkg or the packages
    are not available. The folder is replaced only once the new one is complete.
    """
    target = driver_dir or default_driver_dir()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".vulkan-", dir=target.parent) as scratch:
        work = Path(scratch)
        root = fetch_packages(LAVAPIPE_PACKAGES, BOOKWORM_BACKPORTS, work)
        library = root / _LIB_DIR / "libvulkan_lvp.so"
        shipped = root / "usr/share/vulkan/icd.d" / ICD_NAME
        if not library.is_file() or not shipped.is_file():
            raise InstallError("the packages held no lavapipe (libvulkan_lvp.so, lvp_icd.json)")
        staged = work / "driver"
        (staged / _LIB_DIR).mkdir(parents=True)
        for path in (root / _LIB_DIR).iterdir():
            if path.name.startswith(("libvulkan_lvp", "libdrm")):
                shutil.copy2(path, staged / _LIB_DIR / path.name, follow_symlinks=True)
        icd = json.loads(shipped.read_text())
        icd["ICD"]["library_path"] = str(target / _LIB_DIR / "libvulkan_lvp.so")
        (staged / ICD_NAME).write_text(json.dumps(icd, indent=2) + "\n")
        old = work / "old"
        if target.exists():
            target.rename(old)
        staged.rename(target)
    return target / ICD_NAME


def main(argv: list[str] | None = None) -> int:
    """``python -m rlshell.envs.vulkan install|status``."""
    parser = argparse.ArgumentParser(prog="python -m rlshell.envs.vulkan", description=__doc__)
    parser.add_argument("command", choices=("install", "status"))
    where = f"default: {default_driver_dir()}"
    parser.add_argument("--dir", type=Path, default=None, help=where)
    args = parser.parse_args(argv)
    if args.command == "status":
        choice = use_vulkan_driver(args.dir)
        print(f"{choice.kind}: {choice.detail}")
        return 0 if choice.kind != "none" else 1
    gpu = gpu_vulkan_drivers()
    if gpu and _has_gpu():
        print(f"vulkan: a GPU driver is installed ({', '.join(gpu)}); lavapipe not fetched")
        return 0
    try:
        icd = install_lavapipe(args.dir)
    except InstallError as error:
        print(
            f"vulkan: lavapipe not installed: {error}. ManiSkill envs will not run on this "
            "machine's CPU (everything else is unaffected).",
            file=sys.stderr,
        )
        return 1
    print(f"vulkan: Mesa lavapipe installed ({icd})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

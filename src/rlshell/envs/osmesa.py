"""Software OpenGL (Mesa's OSMesa) for MuJoCo cameras on machines without a GPU.

MuJoCo draws camera images with OpenGL. Off-screen, on a machine without a
GPU, that leaves OSMesa (``MUJOCO_GL=osmesa``): EGL needs a GPU driver, GLFW
a display. Debian 12's ``libosmesa6`` (Mesa 22.3, llvmpipe) does it;
`install_osmesa` fetches it and the ``libglapi-mesa`` of the same build
through a private sources list and package cache (`rlshell.debian_packages`;
the system's apt configuration and packages are left as they are) and copies
their libraries into ``<venv>/share/rlstack/osmesa``. llvmpipe links Debian's
``libLLVM-15.so.1``, which is fetched too where the system has none.
``make install`` runs it (``python -m rlshell.envs.osmesa install``) unless
the system has OSMesa already.

`use_osmesa` is what an env builder calls before MuJoCo is imported, in
every process that builds an env with a camera: a ``MUJOCO_GL`` the user
chose (``egl`` on a GPU machine) is kept; otherwise the installed OSMesa is
loaded (its libraries opened by path, so that PyOpenGL's ``libOSMesa.so.8``
finds the one already in the process) and ``MUJOCO_GL`` and
``PYOPENGL_PLATFORM`` are set to ``osmesa``; its folder goes first on
``LD_LIBRARY_PATH``, for the processes this one starts, which inherit
``MUJOCO_GL`` and would otherwise fail to import MuJoCo. A user sets nothing.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import functools
import os
import shutil
import sys
import tempfile
from pathlib import Path

import attrs

from rlshell.debian_packages import BOOKWORM, InstallError, fetch_packages, share_dir

__all__ = [
    "OSMESA_PACKAGES",
    "GLChoice",
    "InstallError",
    "default_osmesa_dir",
    "install_osmesa",
    "installed_osmesa",
    "system_osmesa",
    "use_osmesa",
]

OSMESA_PACKAGES = ("libosmesa6", "libglapi-mesa")
LLVM_PACKAGE = "libllvm15"
# Opened in this order: each library needs the ones before it.
_LIBRARIES = ("libLLVM-15.so.1", "libglapi.so.0", "libOSMesa.so.8")
_LIB_DIR = Path("usr/lib/x86_64-linux-gnu")


def default_osmesa_dir() -> Path:
    """``share/rlstack/osmesa`` in this Python's prefix (the venv ``make install`` fills)."""
    return share_dir() / "osmesa"


def installed_osmesa(osmesa_dir: Path | None = None) -> Path | None:
    """The folder holding the installed ``libOSMesa.so.8``, or None when it is not installed."""
    folder = osmesa_dir or default_osmesa_dir()
    return folder if (folder / "libOSMesa.so.8").is_file() else None


@functools.cache
def system_osmesa() -> str | None:
    """The system's OSMesa library (what ``ld.so`` finds for ``-lOSMesa``), or None."""
    return ctypes.util.find_library("OSMesa")


@attrs.frozen
class GLChoice:
    """How MuJoCo draws off-screen in this process: ``kind`` is user, osmesa, system or none."""

    kind: str
    detail: str


def use_osmesa(osmesa_dir: Path | None = None) -> GLChoice:
    """Select MuJoCo's off-screen OpenGL for this process (see the module docstring).

    Call it before ``mujoco`` is imported. Idempotent.
    """
    chosen = os.environ.get("MUJOCO_GL", "")
    if chosen and chosen.lower() != "osmesa":
        return GLChoice("user", f"MUJOCO_GL={chosen}")
    folder = installed_osmesa(osmesa_dir)
    if folder is not None:
        for name in _LIBRARIES:
            if (folder / name).is_file():  # libLLVM only where the system lacked it
                ctypes.CDLL(str(folder / name), mode=ctypes.RTLD_GLOBAL)
        # The processes this one starts inherit MUJOCO_GL=osmesa: their loader finds it there.
        search = [path for path in os.environ.get("LD_LIBRARY_PATH", "").split(":") if path]
        if str(folder) not in search:
            os.environ["LD_LIBRARY_PATH"] = ":".join([str(folder), *search])
        choice = GLChoice("osmesa", str(folder))
    elif (library := system_osmesa()) is not None:
        choice = GLChoice("system", library)
    else:
        return GLChoice(
            "none",
            "no OpenGL for MuJoCo's cameras: no MUJOCO_GL set and no OSMesa (run `make "
            "install`, or `python -m rlshell.envs.osmesa install`, to fetch Mesa's OSMesa; "
            "on a GPU machine set MUJOCO_GL=egl)",
        )
    os.environ["MUJOCO_GL"] = "osmesa"
    os.environ.setdefault("PYOPENGL_PLATFORM", "osmesa")
    return choice


def _system_has_llvm15() -> bool:
    try:
        ctypes.CDLL(_LIBRARIES[0])
    except OSError:
        return False
    return True


def install_osmesa(osmesa_dir: Path | None = None) -> Path:
    """Fetch Debian 12's OSMesa into ``osmesa_dir``; return the folder.

    Raises `InstallError` with the reason when apt-get, dpkg or the packages
    are not available. The folder is replaced only once the new one is complete.
    """
    target = osmesa_dir or default_osmesa_dir()
    packages = OSMESA_PACKAGES if _system_has_llvm15() else (*OSMESA_PACKAGES, LLVM_PACKAGE)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".osmesa-", dir=target.parent) as scratch:
        work = Path(scratch)
        root = fetch_packages(packages, BOOKWORM, work)
        staged = work / "osmesa"
        staged.mkdir()
        for name in _LIBRARIES:
            library = root / _LIB_DIR / name
            if library.exists():
                shutil.copy2(library, staged / name, follow_symlinks=True)
            elif name != _LIBRARIES[0]:
                raise InstallError(f"the packages {', '.join(packages)} held no {name}")
        old = work / "old"
        if target.exists():
            target.rename(old)
        staged.rename(target)
    return target


def main(argv: list[str] | None = None) -> int:
    """``python -m rlshell.envs.osmesa install|status``."""
    parser = argparse.ArgumentParser(prog="python -m rlshell.envs.osmesa", description=__doc__)
    parser.add_argument("command", choices=("install", "status"))
    parser.add_argument("--dir", type=Path, default=None, help=f"default: {default_osmesa_dir()}")
    args = parser.parse_args(argv)
    if args.command == "status":
        choice = use_osmesa(args.dir)
        print(f"{choice.kind}: {choice.detail}")
        return 0 if choice.kind != "none" else 1
    system = system_osmesa()
    if system is not None:
        print(f"osmesa: the system's OSMesa is installed ({system}); not fetched")
        return 0
    try:
        folder = install_osmesa(args.dir)
    except InstallError as error:
        print(
            f"osmesa: OSMesa not installed: {error}. MetaWorld's camera observations will not "
            "render on this machine's CPU (everything else is unaffected).",
            file=sys.stderr,
        )
        return 1
    print(f"osmesa: Mesa's OSMesa installed ({folder})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Extension modules: user code that registers models, envs and rewards everywhere.

``RLSHELL_EXT_MODULE`` holds comma-separated module paths (RLinf users know
it as ``RLINF_EXT_MODULE``). Each module defines ``register()``, which calls
`rlshell.registries.register_model` and friends. `load_extensions` imports
them and calls ``register()``; the CLI calls it in the driver before the
config is validated, every Ray worker calls it when it starts, and so does
every standalone tool, so a name registered by an extension is known in
every process. A module that is missing or whose ``register()`` raises fails
at once with an `ExtensionError` naming the module and the process.
"""

from __future__ import annotations

import importlib
import os
import socket
import threading
from collections.abc import Mapping

__all__ = ["ENV_VAR", "ExtensionError", "extension_modules", "load_extensions"]

ENV_VAR = "RLSHELL_EXT_MODULE"

_loaded: set[str] = set()
_lock = threading.Lock()


class ExtensionError(RuntimeError):
    """An extension module could not be imported, has no register(), or its register() raised."""


def extension_modules(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The module paths named by ``RLSHELL_EXT_MODULE`` (blank entries ignored)."""
    value = (os.environ if environ is None else environ).get(ENV_VAR, "")
    return tuple(name.strip() for name in value.split(",") if name.strip())


def load_extensions(modules: tuple[str, ...] | None = None, *, where: str = "driver") -> list[str]:
    """Import each extension module and call its ``register()`` once per process.

    ``modules`` defaults to `extension_modules()`. ``where`` names this process
    in errors ("driver", "actor rank 1", ...). Returns the modules registered
    by this call (those already loaded in this process are skipped).
    """
    names = extension_modules() if modules is None else modules
    process = f"{where} (host {socket.gethostname()}, pid {os.getpid()})"
    registered: list[str] = []
    with _lock:
        for name in names:
            if name in _loaded:
                continue
            try:
                module = importlib.import_module(name)
            except Exception as error:
                raise ExtensionError(
                    f"{ENV_VAR} module '{name}' could not be imported on the {process}: "
                    f"{type(error).__name__}: {error}"
                ) from error
            register = getattr(module, "register", None)
            if not callable(register):
                raise ExtensionError(
                    f"{ENV_VAR} module '{name}' ({module.__file__}) defines no register() "
                    f"function; the {process} cannot load it"
                )
            try:
                register()
            except Exception as error:
                raise ExtensionError(
                    f"{ENV_VAR} module '{name}': register() raised on the {process}: "
                    f"{type(error).__name__}: {error}"
                ) from error
            _loaded.add(name)
            registered.append(name)
    return registered

"""Extension modules: user code that registers models, envs and rewards everywhere.

``RLSHELL_EXT_MODULE`` holds comma-separated module paths; ``RLINF_EXT_MODULE``,
RLinf's name for it, is read the same way. Both may be set: the modules of
``RLSHELL_EXT_MODULE`` load first, then those of ``RLINF_EXT_MODULE``, and a
module named in both (or twice) loads once. Each module defines ``register()``,
which calls `rlshell.registries.register_model` and friends. `load_extensions`
imports them and calls ``register()``; the CLI calls it in the driver before
the config is validated, every Ray worker calls it when it starts, and so does
every standalone tool, so a name registered by an extension is known in every
process. The modules ``RLINF_EXT_MODULE`` adds are written into
``RLSHELL_EXT_MODULE`` of the process that loads them, which is the variable
the processes it starts are handed (Ray workers, reward and tool sandboxes).
A module that is missing or whose ``register()`` raises fails at once with an
`ExtensionError` naming the module, the variable that named it and the process.

Python objects travel the same road. ``RLSHELL_EXT_OBJECTS`` holds
registrations (calls such as ``register_reward("mine", fn)``) pickled by
`encode_registrations`: `rlshell.api` registers the objects it was given in
the driver and, inside `shipping`, sets the variable for every process started
meanwhile (Ray workers get it from `rlshell.cluster.ray_cluster.Cluster.worker_env`,
reward processes inherit it from their worker); `load_extensions` applies it
there after the modules, once per process.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import importlib.metadata
import os
import pickle
import socket
import sys
import threading
import types
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

__all__ = [
    "ENV_VAR",
    "MAX_OBJECTS_CHARS",
    "OBJECTS_ENV_VAR",
    "RLINF_ENV_VAR",
    "ExtensionError",
    "Registration",
    "decode_registrations",
    "encode_registrations",
    "extension_modules",
    "load_extensions",
    "shipping",
]

ENV_VAR = "RLSHELL_EXT_MODULE"
RLINF_ENV_VAR = "RLINF_EXT_MODULE"  # RLinf's name for ENV_VAR, read the same way
OBJECTS_ENV_VAR = "RLSHELL_EXT_OBJECTS"
# Linux refuses an environment string over 128 KiB (MAX_ARG_STRLEN) when it starts a process.
MAX_OBJECTS_CHARS = 100_000

# A call that registers one object, e.g. ``functools.partial(register_reward, "mine", fn)``.
Registration = Callable[[], object]

_loaded: set[str] = set()
_applied: set[str] = set()  # digests of the RLSHELL_EXT_OBJECTS payloads applied in this process
_lock = threading.Lock()


class ExtensionError(RuntimeError):
    """An extension module could not be imported, has no register(), or its register() raised."""


def extension_modules(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The module paths named by ``RLSHELL_EXT_MODULE`` and then ``RLINF_EXT_MODULE``,
    each once (blank entries ignored)."""
    return tuple(_named_by(os.environ if environ is None else environ))


def _named_by(environ: Mapping[str, str]) -> dict[str, str]:
    """Each extension module and the variable that names it first."""
    named: dict[str, str] = {}
    for variable in (ENV_VAR, RLINF_ENV_VAR):
        for name in environ.get(variable, "").split(","):
            named.setdefault(name.strip(), variable)
    named.pop("", None)
    return named


def load_extensions(modules: tuple[str, ...] | None = None, *, where: str = "driver") -> list[str]:
    """Import each extension module and call its ``register()`` once per process.

    ``modules`` defaults to `extension_modules()` (``RLSHELL_EXT_MODULE``'s, then
    ``RLINF_EXT_MODULE``'s, each once; with the latter set, ``RLSHELL_EXT_MODULE``
    is set to them all for the processes this one starts), and then the registrations
    ``RLSHELL_EXT_OBJECTS`` holds are applied too (once per process). ``where``
    names this process in errors ("driver", "actor rank 1", ...). Returns the
    modules registered by this call (those already loaded in this process are
    skipped).
    """
    named = _named_by(os.environ) if modules is None else dict.fromkeys(modules, ENV_VAR)
    process = f"{where} (host {socket.gethostname()}, pid {os.getpid()})"
    registered: list[str] = []
    with _lock:
        if modules is None and os.environ.get(RLINF_ENV_VAR, "").strip():
            # The processes this one starts are handed RLSHELL_EXT_MODULE.
            os.environ[ENV_VAR] = ",".join(named)
        for name, variable in named.items():
            if name in _loaded:
                continue
            try:
                module = importlib.import_module(name)
            except Exception as error:
                raise ExtensionError(
                    f"{variable} module '{name}' could not be imported on the {process}: "
                    f"{type(error).__name__}: {error}"
                ) from error
            register = getattr(module, "register", None)
            if not callable(register):
                raise ExtensionError(
                    f"{variable} module '{name}' ({module.__file__}) defines no register() "
                    f"function; the {process} cannot load it"
                )
            try:
                register()
            except Exception as error:
                raise ExtensionError(
                    f"{variable} module '{name}': register() raised on the {process}: "
                    f"{type(error).__name__}: {error}"
                ) from error
            _loaded.add(name)
            registered.append(name)
        payload = os.environ.get(OBJECTS_ENV_VAR) if modules is None else None
        if payload:
            _apply(payload, process)
    return registered


def _digest(payload: str) -> str:
    return hashlib.sha256(payload.encode()).hexdigest()


def _apply(payload: str, process: str) -> None:
    digest = _digest(payload)
    if digest in _applied:
        return
    try:
        registrations = decode_registrations(payload)
    except Exception as error:
        raise ExtensionError(
            f"{OBJECTS_ENV_VAR}: the Python objects sent by the driver could not be unpickled "
            f"on the {process}: {type(error).__name__}: {error}"
        ) from error
    for label, register in registrations:
        try:
            register()
        except Exception as error:
            raise ExtensionError(
                f"{OBJECTS_ENV_VAR}: registering {label} raised on the {process}: "
                f"{type(error).__name__}: {error}"
            ) from error
    _applied.add(digest)


def _importable_everywhere() -> frozenset[str]:
    """Top-level modules every process of this environment imports by name: the standard
    library and installed distributions (rlshell and rlcore among them)."""
    installed = importlib.metadata.packages_distributions()
    return frozenset(sys.stdlib_module_names) | frozenset(installed) | {"rlshell", "rlcore"}


def _local_packages() -> list[str]:
    """Top-level packages loaded here that are neither installed nor the standard library:
    a script's or a notebook's neighbours, a test suite, a directory on ``sys.path``."""
    everywhere = _importable_everywhere()
    tops = {name.partition(".")[0] for name in list(sys.modules)}
    return sorted(
        top
        for top in tops
        if top not in everywhere
        and not top.startswith("_")
        # sys.modules may hold None (a failed import remembered) or a stand-in object.
        and isinstance(sys.modules.get(top), types.ModuleType)
    )


def encode_registrations(registrations: Mapping[str, Registration]) -> str:
    """``label -> registration`` as the text `RLSHELL_EXT_OBJECTS` carries.

    Pickled with cloudpickle, which pickles what ``__main__`` (a script, a
    notebook) and lambdas define by value. So does it here for every package
    this process loaded that is not installed (a test suite, a module beside
    a notebook): a worker may not find those on its path. What an installed
    package defines travels by reference, as any pickle does. A registration
    that cannot be pickled raises an `ExtensionError` naming its label; so does
    a payload over `MAX_OBJECTS_CHARS`.
    """
    import cloudpickle

    by_value = [
        name
        for name in _local_packages()
        if name not in cloudpickle.list_registry_pickle_by_value()
    ]
    for name in by_value:
        cloudpickle.register_pickle_by_value(sys.modules[name])
    try:
        pickled: dict[str, bytes] = {}
        for label, register in registrations.items():
            try:
                pickled[label] = cloudpickle.dumps(register)
            except Exception as error:
                raise ExtensionError(
                    f"{label} cannot be sent to the Ray workers: pickling it failed with "
                    f"{type(error).__name__}: {error}. An object sent to workers is pickled "
                    "with everything it refers to (globals, closure cells, attributes); keep "
                    "open files, locks and connections out of it, or create them inside it"
                ) from error
        data = cloudpickle.dumps(list(registrations.items()))
    finally:
        for name in by_value:
            cloudpickle.unregister_pickle_by_value(sys.modules[name])
    text = base64.b64encode(zlib.compress(data, 9)).decode("ascii")
    if len(text) > MAX_OBJECTS_CHARS:
        sizes = ", ".join(
            f"{label} {len(blob):,} bytes"
            for label, blob in sorted(pickled.items(), key=lambda item: -len(item[1]))
        )
        raise ExtensionError(
            f"the Python objects for the Ray workers pickle to {len(text):,} characters in "
            f"{OBJECTS_ENV_VAR}, over the {MAX_OBJECTS_CHARS:,} an environment variable can "
            f"carry ({sizes}). Keep large data out of them (load it inside the function), "
            f"or register them in an extension module named by {ENV_VAR}"
        )
    return text


def decode_registrations(payload: str) -> list[tuple[str, Registration]]:
    """The ``(label, registration)`` pairs `encode_registrations` wrote."""
    registrations: list[tuple[str, Registration]] = pickle.loads(
        zlib.decompress(base64.b64decode(payload))
    )
    return registrations


@contextmanager
def shipping(payload: str) -> Iterator[None]:
    """``RLSHELL_EXT_OBJECTS=payload`` while the block runs, for the processes started in it.

    This process counts ``payload`` as applied (its caller has registered the
    objects themselves). On the way out the variable is removed and the
    payload forgotten, so the next block may ship other objects under the
    same names. One block at a time per process.
    """
    if OBJECTS_ENV_VAR in os.environ:
        raise ExtensionError(
            f"{OBJECTS_ENV_VAR} is already set in this process (pid {os.getpid()}): Python "
            "objects are sent to workers by one train() or evaluate() call at a time"
        )
    digest = _digest(payload)
    with _lock:
        os.environ[OBJECTS_ENV_VAR] = payload
        _applied.add(digest)
    try:
        yield
    finally:
        with _lock:
            os.environ.pop(OBJECTS_ENV_VAR, None)
            _applied.discard(digest)

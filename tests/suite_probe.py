"""Per-process CPU accounting for `tests/profile_suite.py`: imports, ``ray.init``, model builds.

`profile_suite` copies this file into the interpreter's site-packages, with a ``.pth``
line that imports it, for the length of one profiled pytest run: then every Python
process of that run (pytest's workers, the runs' drivers, Ray's workers, snippets)
loads it at start-up. It does nothing unless ``RLSTACK_SUITE_PROBE`` names a folder.

It counts, in CPU seconds of the thread that does the work:

- ``imports``: every import of a module not yet loaded (the outermost one of a nest);
- ``ray_init``: ``ray.init`` (a driver starting or joining Ray), its imports left out;
- ``model_builds``: ``rlshell.models.get_model``, its imports left out;

and writes them to ``<folder>/<pid>.json`` (rewritten as they grow: Ray's workers are
killed without running ``atexit``).
"""

from __future__ import annotations

import os

_FOLDER = os.environ.get("RLSTACK_SUITE_PROBE")


def _install(folder: str) -> None:
    import atexit
    import functools
    import importlib._bootstrap as bootstrap
    import json
    import sys
    import threading
    import time
    from typing import Any

    counts: dict[str, Any] = {
        "imports": 0.0,
        "ray_init": 0.0,
        "ray_init_calls": 0,
        "model_builds": 0.0,
        "model_build_calls": 0,
        "argv": list(getattr(sys, "orig_argv", sys.argv)),
    }
    local = threading.local()
    last_write = [0.0]

    def after_fork() -> None:
        # A fork (tests/zygote.py's runs) starts its own count; what it inherited is its parent's.
        for key in ("imports", "ray_init", "model_builds"):
            counts[key] = 0.0
        counts["ray_init_calls"] = counts["model_build_calls"] = 0
        last_write[0] = 0.0

    os.register_at_fork(after_in_child=after_fork)

    def write(force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - last_write[0] < 0.25:
            return
        last_write[0] = now
        counts["argv"] = list(getattr(sys, "orig_argv", sys.argv))
        path = os.path.join(folder, f"{os.getpid()}.json")
        try:
            temp = f"{path}.{threading.get_ident()}.tmp"
            with open(temp, "w") as handle:
                json.dump(counts, handle)
            os.replace(temp, path)
        except OSError:
            pass

    def timed(key: str, calls: str, function: Any) -> Any:
        """``function`` counting its CPU seconds under ``key``, less the imports it made."""

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start, imports = time.thread_time(), counts["imports"]
            try:
                return function(*args, **kwargs)
            finally:
                spent = time.thread_time() - start - (counts["imports"] - imports)
                counts[key] += max(0.0, spent)
                counts[calls] += 1
                write(force=True)

        return wrapper

    original = bootstrap._find_and_load

    def find_and_load(name: str, import_: Any) -> Any:
        depth = getattr(local, "depth", 0)
        start = time.thread_time() if depth == 0 else 0.0
        local.depth = depth + 1
        try:
            module = original(name, import_)
        finally:
            local.depth = depth
            if depth == 0:
                counts["imports"] += time.thread_time() - start
                write()
        if name == "ray" and hasattr(module, "init"):
            module.init = timed("ray_init", "ray_init_calls", module.init)
        elif name == "rlshell.models" and hasattr(module, "get_model"):
            module.get_model = timed("model_builds", "model_build_calls", module.get_model)
        return module

    bootstrap._find_and_load = find_and_load
    atexit.register(write, True)


if _FOLDER:
    _install(_FOLDER)

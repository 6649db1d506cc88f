"""Which config keys did a run read? A tracer of field reads, off unless asked for.

With ``RLSHELL_TRACE_CONFIG_READS=<dir>`` in the environment, importing
`rlshell.config` calls `install`: every field of the config classes
(`rlshell.config.schema`) becomes a data descriptor that, the first time a
process reads it, appends the field's full key path (``actor.optim.lr``) and where
it was read (``file:line (function)``, tab-separated) to ``<dir>/<pid>.keys``,
one key a line. The file is opened, appended to and
closed for each new key, so a worker that Ray kills loses nothing. Ray
workers get the variable from the driver (`rlshell.cluster.ray_cluster.Cluster.worker_env`)::

    RLSHELL_TRACE_CONFIG_READS=/tmp/reads python -m rlshell.train configs/grpo.py
    cut -f1 /tmp/reads/*.keys | sort -u

A read is what the run's own code does with a value. These are not reads and
are not recorded: attrs' and cattrs' generated and library code (pickling a
config for Ray calls attrs' ``__getstate__``, ``config.json`` is written by
cattrs, ``evolve`` copies every field, ``==`` compares them), the config
package itself (loading, field constraints), and anything under
`rlshell.runners.validation.validate` (checking a key is not using it).

Without the variable nothing is installed and reading a field costs what it
always did (a slot lookup).
"""

from __future__ import annotations

import os
import sys
import typing
from pathlib import Path
from types import FrameType
from typing import Any, get_args

import attrs
import cattrs

__all__ = ["TRACE_ENV_VAR", "install", "installed", "key_paths_of_fields", "read_keys"]

TRACE_ENV_VAR = "RLSHELL_TRACE_CONFIG_READS"
"""The environment variable naming the directory the tracer writes ``<pid>.keys`` files to."""

_CONFIG_DIR = str(Path(__file__).resolve().parent) + os.sep
_VALIDATION_FILE = str(Path(__file__).resolve().parents[1] / "runners" / "validation.py")
# Code whose reads are bookkeeping: copies, pickles, comparisons, (un)structuring.
_LIBRARY_DIRS = tuple(
    os.path.dirname(module.__file__) + os.sep
    for module in (attrs, sys.modules["attr"], cattrs)
    if module.__file__ is not None
)
_GENERATED = ("<attrs generated", "<cattrs generated")

_installed: _Recorder | None = None


class _Recorder:
    """Appends each key path read by this process, once, to ``<directory>/<pid>.keys``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.seen: set[str] = set()
        os.register_at_fork(after_in_child=self.seen.clear)  # a forked child has a file of its own

    def record(self, key: str, reader: FrameType) -> None:
        self.seen.add(key)
        self.directory.mkdir(parents=True, exist_ok=True)
        code = reader.f_code
        where = f"{code.co_filename}:{reader.f_lineno} ({code.co_name})"
        with open(self.directory / f"{os.getpid()}.keys", "a", encoding="utf-8") as out:
            out.write(f"{key}\t{where}\n")


class _TracedField:
    """A slot's member descriptor that records the first read of its key in each process."""

    def __init__(self, slot: Any, key: str, recorder: _Recorder) -> None:
        self.slot = slot
        self.key = key
        self.recorder = recorder

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        if instance is None:
            return self
        if self.key not in self.recorder.seen:
            caller = sys._getframe(1)
            if _is_read(caller):
                self.recorder.record(self.key, caller)
        return self.slot.__get__(instance, owner)

    def __set__(self, instance: object, value: Any) -> None:
        self.slot.__set__(instance, value)

    def __delete__(self, instance: object) -> None:
        self.slot.__delete__(instance)


def _is_read(caller: FrameType) -> bool:
    filename = caller.f_code.co_filename
    if filename.startswith(_GENERATED) or filename.startswith(_CONFIG_DIR):
        return False
    if filename.startswith(_LIBRARY_DIRS):
        return False
    frame: FrameType | None = caller
    while frame is not None:
        code = frame.f_code
        if code.co_name == "validate" and code.co_filename == _VALIDATION_FILE:
            return False
        frame = frame.f_back
    return True


def key_paths_of_fields(root: type | None = None) -> dict[tuple[type, str], str]:
    """(config class, field name) → the key path a read of it stands for.

    Found by walking ``root``'s fields (`rlshell.config.Config` by default). A
    class held inside a container (`rlshell.config.PlacementEntry` in
    ``cluster.component_placement``) stands for the container's key. A class
    reached by two paths could not be told apart, and is refused.
    """
    if root is None:
        from rlshell.config.schema import Config

        root = Config
    paths: dict[tuple[type, str], str] = {}
    owners: dict[type, str] = {}

    def walk(cls: type, prefix: str, container: str | None) -> None:
        if cls in owners:
            raise ValueError(
                f"config class {cls.__name__} is reached at '{owners[cls]}' and '{prefix}'; "
                "the read tracer cannot tell its reads apart"
            )
        owners[cls] = prefix
        hints = typing.get_type_hints(cls)
        for field in attrs.fields(cls):
            path = container or (f"{prefix}.{field.name}" if prefix else field.name)
            paths[(cls, field.name)] = path
            tp = hints[field.name]
            if attrs.has(tp):
                walk(tp, path, container)
            else:
                for inner in _attrs_classes_in(tp):
                    walk(inner, path, path)

    walk(root, "", None)
    return paths


def _attrs_classes_in(tp: Any) -> list[type]:
    found = []
    for arg in get_args(tp):
        if isinstance(arg, type) and attrs.has(arg):
            found.append(arg)
        else:
            found += _attrs_classes_in(arg)
    return found


def install(directory: str | os.PathLike[str]) -> None:
    """Trace reads of every config field in this process into ``directory`` (idempotent)."""
    global _installed
    if _installed is not None:
        return
    recorder = _Recorder(Path(directory))
    for (cls, name), key in key_paths_of_fields().items():
        # A field a subclass inherits lives in its base's slot: the subclass gets a descriptor
        # of its own over that slot, so that its reads are told from the base's.
        slot = next(klass.__dict__[name] for klass in cls.__mro__ if name in klass.__dict__)
        if isinstance(slot, _TracedField):
            slot = slot.slot
        setattr(cls, name, _TracedField(slot, key, recorder))
    _installed = recorder


def installed() -> bool:
    """Whether this process traces config reads."""
    return _installed is not None


def read_keys(directory: str | os.PathLike[str]) -> set[str]:
    """Every key path recorded in ``directory`` by any process."""
    keys: set[str] = set()
    for path in Path(directory).glob("*.keys"):
        lines = path.read_text(encoding="utf-8").splitlines()
        keys.update(line.partition("\t")[0] for line in lines if line)
    return keys

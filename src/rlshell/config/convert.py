"""``python -m rlshell.config.convert RLINF.yaml [key.path=value ...] > configs/mine.py``.

Writes the rlstack config module equivalent to an RLinf Hydra YAML config: the
YAML is composed, resolved and mapped key by key as ``python -m rlshell.train``
reads it (`rlshell.config.rlinf`), ``key.path=value`` overrides (rlstack's keys)
are applied, and the module printed defines ``config`` as a `Config` spelled
with the fields that differ from rlstack's defaults. `rlshell.config.read_config`
reads the module back to the same `Config`. A key that cannot be mapped stops
it with the table of refused keys (RLinf key, value, rlstack's key or why there
is none); exit status 2. The module is not validated against the registries and
the placement here: ``python -m rlshell.train configs/mine.py --dry-run`` does
that.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import attrs

import rlshell.config as config_package
from rlshell.config.loading import ConfigError, read_config
from rlshell.config.schema import Config

__all__ = ["config_module", "main"]

EXIT_CONFIG = 2
_INDENT = "    "


def config_module(config: Config, source: str) -> str:
    """Python source of a config module whose ``config`` equals ``config``."""
    classes: dict[str, type] = {}
    body = _render(config, 0, classes)
    imports = _imports(classes)
    return "\n".join(
        [
            '"""rlstack config converted from an RLinf YAML config by rlshell.config.convert.',
            "",
            f"Source: {source}",
            "(docs/from_rlinf.md lists what each RLinf key became).",
            '"""',
            "",
            *imports,
            "",
            f"config = {body}",
            "",
        ]
    )


def _imports(classes: dict[str, type]) -> list[str]:
    by_module: dict[str, list[str]] = {}
    for name, cls in sorted(classes.items()):
        exported = getattr(config_package, name, None) is cls
        by_module.setdefault("rlshell.config" if exported else cls.__module__, []).append(name)
    lines = []
    for module, names in sorted(by_module.items()):
        if len(names) == 1:
            lines.append(f"from {module} import {names[0]}")
        else:
            inner = "".join(f"{_INDENT}{name},\n" for name in names)
            lines.append(f"from {module} import (\n{inner})")
    return lines


def _default(field: Any) -> Any:
    default = field.default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        return default.factory()
    return default


def _render(value: Any, depth: int, classes: dict[str, type]) -> str:
    if attrs.has(type(value)):
        cls = type(value)
        classes[cls.__name__] = cls
        changed = [
            (field.name, getattr(value, field.name))
            for field in attrs.fields(cls)
            if getattr(value, field.name) != _default(field)
        ]
        if not changed:
            return f"{cls.__name__}()"
        pad = _INDENT * (depth + 1)
        inner = "".join(
            f"{pad}{name}={_render(child, depth + 1, classes)},\n" for name, child in changed
        )
        return f"{cls.__name__}(\n{inner}{_INDENT * depth})"
    if isinstance(value, dict):
        items = ", ".join(
            f"{key!r}: {_render(child, depth + 1, classes)}" for key, child in value.items()
        )
        return f"{{{items}}}"
    if isinstance(value, tuple):
        items = ", ".join(_render(child, depth + 1, classes) for child in value)
        return f"({items},)" if len(value) == 1 else f"({items})"
    if isinstance(value, list):
        return "[" + ", ".join(_render(child, depth + 1, classes) for child in value) + "]"
    return repr(value)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rlshell.config.convert",
        description="Print the rlstack config module equivalent to an RLinf YAML config.",
    )
    parser.add_argument("config", help="an RLinf Hydra YAML config (its defaults: beside it)")
    parser.add_argument("overrides", nargs="*", help="rlstack key.path=value overrides")
    args = parser.parse_args(argv)
    if not args.config.endswith((".yaml", ".yml")):
        parser.error(f"{args.config}: expected an RLinf YAML config (.yaml)")
    try:
        config = read_config(args.config, args.overrides)
    except ConfigError as error:
        print(f"error: {args.config}: {error}", file=sys.stderr)
        return EXIT_CONFIG
    sys.stdout.write(config_module(config, args.config))
    return 0


if __name__ == "__main__":
    sys.exit(main())

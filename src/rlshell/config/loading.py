"""Reading a config: a Python module or a resolved JSON, then overrides, then a check.

`read_config` reads ``config`` from a Python config file (or a resolved
``config.json`` written by an earlier run, or an RLinf Hydra YAML config mapped
key by key by `rlshell.config.rlinf`), applies ``key.path=value``
overrides parsed to each field's type, structures the result with cattrs and
runs the caller's check on it (`rlshell.runners.validation.load_config` passes
the validator). Every problem found on the way is collected and raised
together as one `ConfigError`, each line naming the full key path:

    unknown key 'actor.optim.lrr' (did you mean 'actor.optim.lr'?)
    actor.optim.lr: expected a positive number, got -0.1
    algorithm.group_size: grpo needs at least 2 samples per prompt, got 1
"""

from __future__ import annotations

import ast
import copy
import difflib
import importlib.util
import json
import os
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import attrs
import cattrs
from cattrs.errors import (
    BaseValidationError,
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
)

from rlshell.config.rlinf import YAML_SUFFIXES, RLinfConfigError, read_rlinf_config, rlinf_hint
from rlshell.config.schema import Config, NodeGroupEntry, PlacementEntry

__all__ = [
    "CONVERTER",
    "ConfigError",
    "all_key_paths",
    "apply_overrides",
    "config_from_dict",
    "config_to_dict",
    "parse_override_value",
    "read_config",
    "read_config_source",
    "write_config",
]


class ConfigError(ValueError):
    """Everything wrong with a config, one problem per line, each naming its key path."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        count = len(self.problems)
        header = f"{count} problem{'s' if count != 1 else ''} in the config:"
        super().__init__("\n".join([header, *(f"  - {p}" for p in self.problems)]))


# --- a strict converter -------------------------------------------------------------------------
# cattrs's defaults coerce (int(3.7) == 3, str(5) == "5"); a config must not.

CONVERTER = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)


def _strict(kind: type, accepts: tuple[type, ...], name: str) -> None:
    def structure(value: Any, _: type) -> Any:
        if isinstance(value, bool) and kind is not bool:
            raise TypeError(f"expected {name}, got {value!r}")
        if not isinstance(value, accepts):
            raise TypeError(f"expected {name}, got {value!r}")
        return kind(value)

    CONVERTER.register_structure_hook(kind, structure)


_strict(int, (int,), "an integer")
_strict(float, (int, float), "a number")
_strict(bool, (bool,), "true or false")
_strict(str, (str,), "a string")


def _string_or(entry: type[Any], example: str) -> None:
    """Read ``str | entry``: a string as it is, a mapping as an ``entry`` record."""

    def structure(value: Any, _: type) -> Any:
        if isinstance(value, str):
            return value
        if isinstance(value, Mapping):
            return CONVERTER.structure(value, entry)
        raise TypeError(f"expected {example}, got {value!r}")

    CONVERTER.register_structure_hook(str | entry, structure)


_string_or(
    PlacementEntry,
    'a placement string such as \'0-7\' or {"placement": "0-7", "node_group": "a800"}',
)
_string_or(
    NodeGroupEntry,
    'node ranks such as \'0-1\' or {"node_ranks": "0-1", "env_configs": [...], "hardware": {...}}',
)


def _structure_scalar(value: Any, _: type) -> int | float | str | bool:
    if isinstance(value, int | float | str | bool):
        return value
    raise TypeError(f"expected a number, string or boolean, got {value!r}")


CONVERTER.register_structure_hook(int | float | str | bool, _structure_scalar)


def _is_model_option(tp: Any) -> bool:
    # ModelOption is recursive: get_type_hints expands it a level, so match its scalar head.
    members = _union_members(tp)
    return members is not None and members[:5] == (int, float, bool, str, type(None))


def _structure_model_option(value: Any, _: type) -> Any:
    problem = _model_option_problem(value, "")
    if problem is not None:
        where, reason = problem
        raise TypeError(f"{reason} (at {where.removeprefix('.')})" if where else reason)
    return value


def _model_option_problem(value: Any, where: str) -> tuple[str, str] | None:
    """(where inside ``value``, why) it is not a `ModelOption`, or None when it is one."""
    if value is None or isinstance(value, int | float | str | bool):
        return None
    if isinstance(value, list | tuple):
        items = ((f"{where}[{index}]", item) for index, item in enumerate(value))
    elif isinstance(value, Mapping):
        bad_key = next((key for key in value if not isinstance(key, str)), None)
        if bad_key is not None:
            return where, f"expected string keys, got {bad_key!r}"
        items = ((f"{where}.{key}", item) for key, item in value.items())
    else:
        return where, (
            "expected a number, string, boolean, null, list or mapping, "
            f"got {type(value).__name__} {value!r}"
        )
    return next((p for w, item in items if (p := _model_option_problem(item, w))), None)


CONVERTER.register_structure_hook_func(_is_model_option, _structure_model_option)


def config_to_dict(config: Config) -> dict[str, Any]:
    """The config as plain JSON-able data (what ``config.json`` holds)."""
    data: dict[str, Any] = CONVERTER.unstructure(config)
    return data


def config_from_dict(data: Mapping[str, Any]) -> Config:
    """Structure plain data into a `Config`; every mismatch is reported in one `ConfigError`."""
    try:
        return CONVERTER.structure(dict(data), Config)
    except BaseValidationError as error:
        raise ConfigError(list(_describe_structure_error(error, (), Config))) from None


def write_config(config: Config, path: Path) -> Path:
    """Write the resolved config as JSON, atomically; `read_config_source` reads it back."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(config_to_dict(config), indent=2) + "\n", encoding="utf-8")
    os.replace(partial, path)  # readers see the old file or the new one, never half of one
    return path


# --- reading a config file ----------------------------------------------------------------------


def read_config_source(path: str | Path | Config | Mapping[str, Any]) -> dict[str, Any]:
    """Plain data from a Python config module (its ``config``), a JSON config file, an
    RLinf YAML config (`rlshell.config.rlinf`), a `Config` or a mapping (copied:
    overrides never change the caller's)."""
    if isinstance(path, Config):
        return config_to_dict(path)
    if isinstance(path, Mapping):
        return copy.deepcopy(dict(path))
    source = Path(path)
    if not source.is_file():
        raise ConfigError([f"config file {source} does not exist"])
    if source.suffix == ".json":
        try:
            data = json.loads(source.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ConfigError([f"{source}: not valid JSON ({error})"]) from None
        if not isinstance(data, dict):
            raise ConfigError([f"{source}: expected a JSON object, got {type(data).__name__}"])
        return data
    if source.suffix in YAML_SUFFIXES:
        try:
            return read_rlinf_config(source)
        except RLinfConfigError as error:
            raise ConfigError(error.problems) from None
    if source.suffix != ".py":
        raise ConfigError(
            [f"{source}: a config file is a Python module (.py), a JSON file or an RLinf YAML"]
        )
    config = getattr(_import_file(source), "config", None)
    if isinstance(config, Config):
        return config_to_dict(config)
    if isinstance(config, Mapping):
        return dict(config)
    raise ConfigError(
        [f"{source} must define `config` (an rlshell.config.Config), got {type(config).__name__}"]
    )


def _import_file(path: Path) -> types.ModuleType:
    name = f"rlshell_config_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError([f"{path}: cannot be imported as a Python module"])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        message = f"{path} raised while being imported: {type(error).__name__}: {error}"
        raise ConfigError([message]) from error
    return module


# --- overrides ----------------------------------------------------------------------------------


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> list[str]:
    """Apply ``key.path=value`` overrides to config data in place; return the problems found.

    Each value is parsed to the type of the field it sets; a bad override is
    reported and leaves the field as it was, so later checks still see a
    complete config.
    """
    problems: list[str] = []
    for override in overrides:
        key, sep, raw = override.partition("=")
        key = key.strip()
        if not sep or not key:
            problems.append(f"override '{override}': expected key.path=value")
            continue
        try:
            _set_path(data, Config, key.split("."), raw, key)
        except _Problem as problem:
            problems.append(str(problem))
    return problems


class _Problem(Exception):
    pass


def _set_path(data: dict[str, Any], cls: type, parts: list[str], raw: str, key: str) -> None:
    node: dict[str, Any] = data
    tp: Any = cls
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        if attrs.has(tp):
            fields = attrs.fields_dict(tp)
            if part not in fields:
                raise _Problem(_unknown_key(".".join(parts[: index + 1]), key))
            field_type = _hints(tp)[part]
        elif get_origin(tp) is dict:
            field_type = get_args(tp)[1]
        else:
            where = ".".join(parts[:index])
            raise _Problem(f"{key}: '{where}' is a value, not a section")
        if last:
            node[part] = _unstructure_parsed(parse_override_value(raw, field_type, key), field_type)
            return
        child = node.get(part)
        if child is None or not isinstance(child, dict):
            if attrs.has(field_type) or get_origin(field_type) is dict:
                child = {} if child is None else child
                node[part] = child
            else:
                raise _Problem(f"{key}: '{'.'.join(parts[: index + 1])}' is a value, not a section")
        node, tp = child, field_type


def _unstructure_parsed(value: Any, tp: Any) -> Any:
    return CONVERTER.unstructure(value, unstructure_as=tp) if value is not None else None


_NULLS = {"null", "none", "~"}
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def parse_override_value(raw: str, tp: Any, key: str = "value") -> Any:
    """Parse an override's text to ``tp``: numbers, booleans, literals, null, JSON for the rest.

    Raises a problem message naming ``key`` and what was expected.
    """
    text = raw.strip()
    if _is_model_option(tp):
        return _parse_model_option(raw, key)
    members = _union_members(tp)
    if members is not None:
        if type(None) in members and text.lower() in _NULLS:
            return None
        failures = []
        candidates = [m for m in members if m is not type(None)]
        structured = [m for m in candidates if m is not str]
        if text[:1] in ("{", "[") and structured:  # JSON text means a structured value
            candidates = structured
        for member in candidates:
            try:
                return parse_override_value(raw, member, key)
            except _Problem as problem:
                failures.append(str(problem))
        if len(failures) == 1:
            raise _Problem(failures[0])
        reasons = [failure.removeprefix(f"{key}: ") for failure in failures]
        raise _Problem(f"{key}: " + " or ".join(dict.fromkeys(reasons)))
    origin = get_origin(tp)
    if origin is Literal:
        options = [str(option) for option in get_args(tp)]
        if text in options:
            return text
        raise _Problem(
            f"{key}: expected one of {_quoted(options)}, got '{text}'{_hint(text, options)}"
        )
    if tp is bool:
        if text.lower() in _TRUE | _FALSE:
            return text.lower() in _TRUE
        raise _Problem(f"{key}: expected true or false, got '{text}'")
    if tp is int:
        try:
            return int(text)
        except ValueError:
            raise _Problem(f"{key}: expected an integer, got '{text}'") from None
    if tp is float:
        try:
            return float(text)
        except ValueError:
            raise _Problem(f"{key}: expected a number, got '{text}'") from None
    if tp is str:
        return raw
    return _parse_structured(text, tp, key)


def _parse_model_option(raw: str, key: str) -> Any:
    """A `ModelOption` from override text: null, a number, true/false, JSON (or a Python
    literal) for a list or mapping, else the text as a string."""
    text = raw.strip()
    if text.lower() in _NULLS:
        return None
    if text[:1] in ("[", "{"):
        value = _json_or_literal(text, f"{key}: expected a JSON list or mapping, got '{text}'")
        problem = _model_option_problem(value, key)
        if problem is not None:
            raise _Problem(f"{problem[0]}: {problem[1]}")
        return value
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return raw


def _json_or_literal(text: str, problem: str) -> Any:
    """``text`` read as JSON, else as a Python literal; neither raises ``problem``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise _Problem(problem) from None


def _parse_structured(text: str, tp: Any, key: str) -> Any:
    value = _json_or_literal(text, f"{key}: expected JSON for {_type_name(tp)}, got '{text}'")
    try:
        return CONVERTER.structure(value, tp)
    except BaseValidationError as error:
        raise _Problem("; ".join(_describe_structure_error(error, (key,), tp))) from None
    except (TypeError, ValueError) as error:
        raise _Problem(f"{key}: {error}") from None
    except AttributeError:  # cattrs reading a mapping's items() from a non-mapping
        raise _Problem(f"{key}: expected JSON for {_type_name(tp)}, got '{text}'") from None


def _union_members(tp: Any) -> tuple[Any, ...] | None:
    if get_origin(tp) in (typing.Union, types.UnionType):
        return get_args(tp)
    return None


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _quoted(options: Sequence[str]) -> str:
    return ", ".join(f"'{option}'" for option in options)


def _hint(text: str, options: Sequence[str]) -> str:
    close = difflib.get_close_matches(text, list(options), n=1, cutoff=0.5)
    return f" (did you mean '{close[0]}'?)" if close else ""


# --- key paths ----------------------------------------------------------------------------------


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def all_key_paths(cls: type = Config, prefix: str = "") -> Iterator[str]:
    """Every section and field path of the schema, e.g. 'actor', 'actor.optim', 'actor.optim.lr'."""
    for name, tp in _hints(cls).items():
        path = f"{prefix}{name}"
        yield path
        if attrs.has(tp):
            yield from all_key_paths(tp, path + ".")


def _unknown_key(path: str, full: str | None = None) -> str:
    """'unknown key ...' for ``full`` (default ``path``); its prefix ``path`` is not in the schema.

    The suggestion is the closest key at the same level ('actor.optim.lrr' ->
    'actor.optim.lr'), else a key the misplaced path ends ('optim.lr' ->
    'actor.optim.lr'), else the closest key anywhere; the rest of ``full``
    after ``path`` is kept on the suggestion when that makes a valid key.
    """
    full = full or path
    rlinf = rlinf_hint(full) or rlinf_hint(path)
    if rlinf is not None:
        return f"unknown key '{full}': {rlinf}"
    rest = full[len(path) :]
    candidates = list(all_key_paths())
    valid = set(candidates)
    parent = path.rpartition(".")[0]
    siblings = [c for c in candidates if c.rpartition(".")[0] == parent]
    suggestion = None
    misplaced = [c for c in candidates if c.endswith("." + full)]
    close = difflib.get_close_matches(path, siblings, n=1, cutoff=0.6)
    if close and (not rest or close[0] + rest in valid):
        suggestion = close[0] + rest
    elif misplaced:
        suggestion = misplaced[0]
    else:
        anywhere = difflib.get_close_matches(full, candidates, n=1, cutoff=0.6)
        suggestion = anywhere[0] if anywhere else None
    hint = f" (did you mean '{suggestion}'?)" if suggestion else ""
    return f"unknown key '{full}'{hint}"


def _join(path: Sequence[str]) -> str:
    return ".".join(path).replace(".[", "[")


def _describe_structure_error(
    error: BaseException, path: tuple[str, ...], tp: Any
) -> Iterator[str]:
    where = _join(path)
    if isinstance(error, ForbiddenExtraKeysError):
        for extra in sorted(error.extra_fields):
            yield _unknown_key(_join((*path, extra)))
        return
    if isinstance(error, ClassValidationError):
        with_notes, without = error.group_exceptions()
        hints = _hints(tp) if attrs.has(tp) else {}
        for sub, note in with_notes:
            yield from _describe_structure_error(sub, (*path, note.name), hints.get(note.name))
        for sub in without:
            yield from _describe_structure_error(sub, path, tp)
        return
    if isinstance(error, IterableValidationError):
        with_index, without = error.group_exceptions()
        mapping = get_origin(tp) in (dict, Mapping)
        element = get_args(tp)[-1 if mapping else 0] if get_args(tp) else None
        for sub, index_note in with_index:
            # a mapping's entries are keys of the path (model_kwargs.image_size), not indices
            part = str(index_note.index) if mapping else f"[{index_note.index}]"
            yield from _describe_structure_error(sub, (*path, part), element)
        for sub in without:
            yield from _describe_structure_error(sub, path, tp)
        return
    if isinstance(error, KeyError) and error.args:
        yield f"{where}.{error.args[0]}: missing" if where else f"{error.args[0]}: missing"
        return
    message = str(error)
    if isinstance(error, TypeError | AttributeError) and (
        attrs.has(tp) or get_origin(tp) in (dict, Mapping)
    ):
        # cattrs iterates or calls .items() on what should be a mapping.
        got = re.search(r"type '(\w+)'|'(\w+)' object", message)
        kind = next((name for name in got.groups() if name), None) if got else None
        expected = "a section (a mapping of its keys)" if attrs.has(tp) else "a mapping"
        message = f"expected {expected}, got {'a value of type ' + kind if kind else message}"
    elif "not in literal" in message or (
        isinstance(error, ValueError) and get_origin(tp) is Literal
    ):
        options = [str(option) for option in get_args(tp)]
        message = f"expected one of {_quoted(options)}"
    yield f"{where}: {message}" if where else message


# --- the whole load -----------------------------------------------------------------------------


def read_config(
    source: str | Path | Config | Mapping[str, Any],
    overrides: Sequence[str] = (),
    check: Callable[[Config], list[str]] | None = None,
) -> Config:
    """Read a config file (or a resolved ``config.json``), apply ``key.path=value``
    overrides, structure the result and run ``check`` on it; raise one `ConfigError`
    listing every problem found on the way (unknown keys, wrong types, unparsable
    values, and what ``check`` returns).

    ``check`` is the validator of the layer that knows the rules between fields
    (`rlshell.runners.validation.validate`; `rlshell.runners.validation.load_config`
    passes it); without one only the file, the overrides and the types are checked.
    """
    data = read_config_source(source)
    problems = apply_overrides(data, overrides)
    try:
        config = config_from_dict(data)
    except ConfigError as error:
        raise ConfigError([*problems, *error.problems]) from None
    if check is not None:
        problems += check(config)
    if problems:
        raise ConfigError(problems)
    return config

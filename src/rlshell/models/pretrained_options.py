"""The options of ``actor.model.model_kwargs`` that a Hugging Face model is loaded with.

RLinf's model sections carry ``from_pretrained`` options beside a model's own
keys (``attn_implementation: "flash_attention_2"``, ``trust_remote_code: True``,
``low_cpu_mem_usage: True``, ``image_size: [224, 224]``, nested mappings). They
go in ``model_kwargs`` here, and `PretrainedOptions.read` splits them:

- the options rlstack knows are typed, and a wrong type is an error naming the key:
  ``attn_implementation`` (a string: ``eager``, ``sdpa``, ``flash_attention_2``...;
  transformers checks the name), ``trust_remote_code`` (a boolean, false by
  default), ``low_cpu_mem_usage`` (a boolean; only when loading from
  ``actor.model.path``), ``torch_dtype`` / ``dtype`` (accepted only when it names
  the dtype ``actor.model.precision`` builds in: precision decides);
- every other entry passes through as it is, lists and mappings included: with
  ``path`` to ``from_pretrained`` (which sets the config fields it names, such as
  ``rope_parameters``, and hands the rest to the model class: a model that takes
  ``unnorm_key`` gets it), without ``path`` to the config class, as its fields.

An option the model refuses stops the build with a ValueError naming its key
(`refused_option`), not with transformers' message alone.

``trust_remote_code=True`` lets transformers import and run the Python files a
model's directory or Hub repository ships (its ``auto_map``): code from
elsewhere, trusted as an extension module is (docs/security.md). It is never
on unless the config says so, and a model that needs it is refused without it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch
from attrs import field, frozen

from rlshell.config.schema import ModelOption
from rlshell.models.model_kwargs import PREFIX

__all__ = ["DTYPE_KEYS", "LOAD_OPTIONS", "PretrainedOptions", "refused_option"]

# The loading options read here; any other model_kwargs entry is passed through.
LOAD_OPTIONS = ("attn_implementation", "trust_remote_code", "low_cpu_mem_usage")
DTYPE_KEYS = ("torch_dtype", "dtype")
_DTYPE_NAMES: dict[torch.dtype, tuple[str, ...]] = {
    torch.float32: ("float32", "fp32", "float", "torch.float32"),
    torch.bfloat16: ("bfloat16", "bf16", "torch.bfloat16"),
    torch.float16: ("float16", "fp16", "half", "torch.float16"),
}
_PRECISION = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
T = TypeVar("T")


@frozen
class PretrainedOptions:
    """What a Hugging Face builder passes on: typed loading options and the rest as given."""

    attn_implementation: str | None = None
    trust_remote_code: bool = False
    low_cpu_mem_usage: bool | None = None
    passthrough: Mapping[str, ModelOption] = field(factory=dict)

    @classmethod
    def read(
        cls,
        kwargs: Mapping[str, ModelOption],
        dtype: torch.dtype | None,
        from_path: bool,
        skip: tuple[str, ...] = (),
    ) -> PretrainedOptions:
        """Split ``kwargs`` (``model_kwargs``, less the keys in ``skip``); a bad option
        raises ValueError naming ``actor.model.model_kwargs.<key>``. ``dtype`` is the one
        ``actor.model.precision`` builds in (None: no model is built, only its config read, and
        ``torch_dtype`` goes unchecked); ``from_path``: loaded from ``actor.model.path``."""
        attn = kwargs.get("attn_implementation")
        if attn is not None and (not isinstance(attn, str) or not attn.strip()):
            raise ValueError(
                f"{PREFIX}.attn_implementation: expected a name such as 'sdpa', 'eager' or "
                f"'flash_attention_2', got {attn!r}"
            )
        low_cpu = _optional_bool(kwargs, "low_cpu_mem_usage")
        if low_cpu is not None and not from_path:
            raise ValueError(
                f"{PREFIX}.low_cpu_mem_usage: only read when the weights are loaded from "
                "actor.model.path; a model built from model_kwargs has no weights to load"
            )
        for key in DTYPE_KEYS:
            if key in kwargs and dtype is not None:
                _check_dtype(key, kwargs[key], dtype)
        skipped = {*LOAD_OPTIONS, *DTYPE_KEYS, *skip}
        return cls(
            attn_implementation=attn,
            trust_remote_code=bool(_optional_bool(kwargs, "trust_remote_code")),
            low_cpu_mem_usage=low_cpu,
            passthrough={key: value for key, value in kwargs.items() if key not in skipped},
        )

    def loading(self) -> dict[str, Any]:
        """The typed options that are set, as ``from_pretrained`` / ``from_config`` take them."""
        options: dict[str, Any] = {"trust_remote_code": self.trust_remote_code}
        if self.attn_implementation is not None:
            options["attn_implementation"] = self.attn_implementation
        if self.low_cpu_mem_usage is not None:
            options["low_cpu_mem_usage"] = self.low_cpu_mem_usage
        return options

    def named(self) -> tuple[str, ...]:
        """The keys whose options a load is given, typed or passed through (for errors):
        ``trust_remote_code`` always, since a model that ships code is refused without it."""
        set_ = [key for key in LOAD_OPTIONS if getattr(self, key) is not None]
        return (*set_, *self.passthrough)


def refused_option(call: Callable[[], T], keys: tuple[str, ...], model: str) -> T:
    """``call()``; a TypeError or ValueError whose message names one of ``keys`` (the
    ``model_kwargs`` entries it was given) becomes a ValueError naming that key as
    ``actor.model.model_kwargs.<key>`` and ``model``, transformers' message after it."""
    try:
        return call()
    except (TypeError, ValueError) as error:
        message = str(error)
        named = [key for key in keys if re.search(rf"(?<![\w.]){re.escape(key)}(?!\w)", message)]
        if not named:
            raise
        raise ValueError(f"{PREFIX}.{named[0]}: {model} refused it: {message}") from error


def _optional_bool(kwargs: Mapping[str, ModelOption], key: str) -> bool | None:
    value = kwargs.get(key)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError(f"{PREFIX}.{key}: expected true or false, got {value!r}")


def _check_dtype(key: str, value: ModelOption, dtype: torch.dtype) -> None:
    names = _DTYPE_NAMES.get(dtype, (str(dtype),))
    if isinstance(value, str) and value in names:
        return
    raise ValueError(
        f"{PREFIX}.{key}: {value!r} is not actor.model.precision's dtype ({names[0]}); the "
        f"model is built in the precision's dtype: set actor.model.precision (now "
        f"'{_PRECISION.get(dtype, dtype)}') and remove {key}"
    )

"""rlcore: the pure, typed maths of reinforcement-learning post-training.

Advantage estimators, losses, KL estimators, masked reductions, log-prob
helpers, sampler–trainer mismatch corrections, action distributions and
rollout transforms as pure functions over jaxtyping-annotated torch tensors.
No I/O, no global state, no model code; the only imports are torch, numpy,
attrs, beartype and jaxtyping (and jax inside `rlcore.jax`).

Every public function is wrapped by `typecheck`, which checks shapes and
dtypes at call time; set ``RLCORE_TYPECHECK=0`` before import to skip it,
or run a hot loop whose shapes were checked once inside `rlcore.unchecked()`.

The package imports its modules when they are first used (``rlcore.losses``,
``from rlcore import masked``): a process that needs only `rlcore.registry`'s
`Registry` (a reward process) does not import torch. The built-in advantage
estimators and policy losses are registered when their registry is first read.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlcore import (
        advantages,
        batching,
        distributions,
        logprobs,
        losses,
        masked,
        mismatch,
        normalize,
        packing,
        registry,
        shaping,
        tokens,
    )
    from rlcore._checking import TypeCheckError, typecheck, typecheck_enabled, unchecked
    from rlcore.types import Advantages, LossOutput, Mask, as_bool_mask

# Names defined in a module of the package: name -> that module.
_NAMES = {
    "TypeCheckError": "rlcore._checking",
    "typecheck": "rlcore._checking",
    "typecheck_enabled": "rlcore._checking",
    "unchecked": "rlcore._checking",
    "Advantages": "rlcore.types",
    "LossOutput": "rlcore.types",
    "Mask": "rlcore.types",
    "as_bool_mask": "rlcore.types",
}

__all__ = [
    "Advantages",
    "LossOutput",
    "Mask",
    "TypeCheckError",
    "advantages",
    "as_bool_mask",
    "batching",
    "distributions",
    "logprobs",
    "losses",
    "masked",
    "mismatch",
    "normalize",
    "packing",
    "registry",
    "shaping",
    "tokens",
    "typecheck",
    "typecheck_enabled",
    "unchecked",
]

# The rest of __all__ are the package's modules.
_MODULES = frozenset(__all__) - set(_NAMES)

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """A public module or name of the package, imported on first use (PEP 562)."""
    if name in _MODULES:
        value: Any = importlib.import_module(f"rlcore.{name}")
    elif name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name]), name)
    else:
        raise AttributeError(f"module 'rlcore' has no attribute '{name}'")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return [*__all__, "__version__"]

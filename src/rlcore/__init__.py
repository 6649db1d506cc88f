"""rlcore: the pure, typed maths of reinforcement-learning post-training.

Advantage estimators, losses, KL estimators, masked reductions, log-prob
helpers, sampler–trainer mismatch corrections, action distributions and
rollout transforms as pure functions over jaxtyping-annotated torch tensors.
No I/O, no global state, no model code; the only imports are torch, numpy,
attrs, beartype and jaxtyping (and jax inside `rlcore.jax`).

Every public function is wrapped by `typecheck`, which checks shapes and
dtypes at call time; set ``RLCORE_TYPECHECK=0`` before import to skip it,
or run a hot loop whose shapes were checked once inside `rlcore.unchecked()`.
"""

from rlcore import (
    advantages,
    distributions,
    logprobs,
    losses,
    masked,
    mismatch,
    normalize,
    registry,
    rollout,
)
from rlcore._checking import TypeCheckError, typecheck, typecheck_enabled, unchecked
from rlcore.types import Advantages, LossOutput, Mask, as_bool_mask

__all__ = [
    "Advantages",
    "LossOutput",
    "Mask",
    "TypeCheckError",
    "advantages",
    "as_bool_mask",
    "distributions",
    "logprobs",
    "losses",
    "masked",
    "mismatch",
    "normalize",
    "registry",
    "rollout",
    "typecheck",
    "typecheck_enabled",
    "unchecked",
]

__version__ = "0.1.0"

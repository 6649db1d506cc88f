"""An rlcore extension: an advantage estimator and a policy loss, type-checked like rlcore.

- ``win_rate`` (`WinRateEstimator`): each response's pairwise win rate within
  its prompt group, a rank-based, scale-free advantage.
- ``cispo`` (`cispo`): REINFORCE with a clipped, stop-gradient importance
  weight (MiniMax-M1's CISPO).

Both are pure functions over jaxtyping-annotated tensors, checked at run time
by `rlcore.typecheck` and statically by ``mypy --strict`` (this package's
``pyproject.toml``). `register()` puts them in `rlcore.registry`; with
``RLSHELL_EXT_MODULE=rlstack_typed_ext`` every rlshell process calls it, and a
config can say ``algorithm.adv_type=win_rate algorithm.loss_type=cispo``.
"""

from __future__ import annotations

from rlcore.registry import ADVANTAGES, POLICY_LOSSES
from rlstack_typed_ext import advantages, losses
from rlstack_typed_ext.advantages import WinRateEstimator, pairwise_win_rate
from rlstack_typed_ext.losses import cispo, cispo_policy_loss

__all__ = [
    "WinRateEstimator",
    "cispo",
    "cispo_policy_loss",
    "pairwise_win_rate",
    "register",
]


def register(force: bool = False) -> None:
    """Register ``win_rate`` and ``cispo`` with rlcore's registries.

    Idempotent: registering the same entries again changes nothing. A name
    already taken by a different entry raises `KeyError` unless ``force=True``,
    which replaces it.
    """
    ADVANTAGES.register(advantages.NAME, WinRateEstimator(), force=force)
    POLICY_LOSSES.register(losses.NAME, cispo, force=force)

"""Hypothesis strategies and property checks for rlcore and for users' own maths.

Needs the ``hypothesis`` package (the ``testing`` or ``dev`` extra); `import
rlcore` never imports this subpackage.
"""

from rlcore.testing.properties import check_advantage_estimator, check_policy_loss
from rlcore.testing.strategies import (
    CategoricalBatch,
    GaussianBatch,
    TokenBatch,
    Trajectory,
    categorical_batches,
    gaussian_batches,
    group_scores,
    masks,
    token_batches,
    trajectories,
)

__all__ = [
    "CategoricalBatch",
    "GaussianBatch",
    "TokenBatch",
    "Trajectory",
    "categorical_batches",
    "check_advantage_estimator",
    "check_policy_loss",
    "gaussian_batches",
    "group_scores",
    "masks",
    "token_batches",
    "trajectories",
]

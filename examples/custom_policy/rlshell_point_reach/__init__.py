"""An rlshell extension with its own policy and environment: PPO on a point-mass reach task.

Point ``RLSHELL_EXT_MODULE`` at this package and every rlshell process (the
driver and each Ray worker) runs `register()` before it reads a config, so
the model type ``linear_gaussian`` and the env type ``point_reach`` can be
named in any config, e.g. ``examples/custom_policy/config.py``::

    PYTHONPATH=examples/custom_policy RLSHELL_EXT_MODULE=rlshell_point_reach \\
        python -m rlshell.train examples/custom_policy/config.py
"""

from __future__ import annotations

from rlshell_point_reach.env import PointReach, make_point_reach_env
from rlshell_point_reach.policy import LinearGaussianPolicy, build_linear_gaussian_policy

__all__ = [
    "LinearGaussianPolicy",
    "PointReach",
    "build_linear_gaussian_policy",
    "make_point_reach_env",
    "register",
]


def register() -> None:
    """Register this package's policy and env with rlshell's registries."""
    from rlshell.envs import register_env
    from rlshell.models import register_model

    register_model("linear_gaussian", build_linear_gaussian_policy, category="embodied")
    register_env("point_reach", make_point_reach_env)

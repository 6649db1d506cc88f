"""An rlshell extension: a model, an environment and a reward that live outside rlshell.

Point ``RLSHELL_EXT_MODULE`` at this package and every rlshell process (the
driver, each Ray worker, standalone tools) runs `register()` before it reads
a config, so ``bandit_mlp``, ``two_armed_bandit`` and ``contains_answer`` can
be named in any config::

    PYTHONPATH=examples/extension RLSHELL_EXT_MODULE=rlshell_example_ext \\
        python -m rlshell.train configs/grpo.py reward.reward_type=contains_answer --dry-run
"""

from __future__ import annotations

from rlshell_example_ext.bandit import TwoArmedBandit, make_bandit_env
from rlshell_example_ext.policy import BanditPolicy, build_bandit_policy
from rlshell_example_ext.reward import contains_answer

__all__ = [
    "BanditPolicy",
    "TwoArmedBandit",
    "build_bandit_policy",
    "contains_answer",
    "make_bandit_env",
    "register",
]


def register() -> None:
    """Register this package's model, env and reward with rlshell's registries."""
    from rlshell.envs import register_env
    from rlshell.models import register_model
    from rlshell.rewards import register_reward

    register_model("bandit_mlp", build_bandit_policy, category="embodied")
    register_env("two_armed_bandit", make_bandit_env)
    register_reward("contains_answer", contains_answer)

"""Facts a run's config fixes, read by the run spec and every trainer's rules alike.

`ProcessLayout`: which placement key places each component (components under one key
share processes). `trains_critic`: whether the run trains a value function. Each is
derived here once: `rlshell.runners.spec.RunSpec` carries them, and the rules
(`rlshell.runners.rules`), which the spec's module imports, read them from here.
"""

from __future__ import annotations

from collections.abc import Mapping

from attrs import frozen

from rlshell.config import Config, PlacementEntry

__all__ = ["ProcessLayout", "trains_critic"]


@frozen
class ProcessLayout:
    """Which placement key places each component: components under one key share processes.

    ``{"actor,rollout": "0-1", "reward": "0"}``: the actor's ranks also run the
    rollout; the reward runs in processes of its own.
    """

    keys: Mapping[str, str]

    @classmethod
    def of(cls, placement: Mapping[str, str | PlacementEntry]) -> ProcessLayout:
        return cls(
            {name.strip(): key for key in placement for name in key.split(",") if name.strip()}
        )

    def shared(self, *names: str) -> bool:
        """Whether every one of ``names`` is placed, all under the same key."""
        keys = {self.keys.get(name) for name in names}
        return None not in keys and len(keys) == 1

    def apart(self, *names: str) -> bool:
        """Whether every one of ``names`` is placed, each under a key of its own."""
        keys = [self.keys.get(name) for name in names]
        return None not in keys and len(set(keys)) == len(keys)

    def key_of(self, name: str) -> str | None:
        return self.keys.get(name)


def trains_critic(config: Config) -> bool:
    """Whether the run trains a value function: GAE reads its values (the reasoning
    runner's critic worker; embodied PPO's value head). SAC's Q functions are its own
    learner's, and the sft and probe runs train none."""
    runner, algorithm = config.runner.runner_type, config.algorithm
    return (
        runner in ("reasoning", "embodied")
        and algorithm.loss_type != "sac"
        and algorithm.adv_type == "gae"
    )

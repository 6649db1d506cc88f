"""Facts a run's config fixes, read by the run spec and every trainer's rules alike.

`ProcessLayout`: which placement key places each component (components under one key
share processes). `trains_critic`: whether the run trains a value function.
`RunFacts`: both, derived once from a config; `rlshell.runners.spec.RunSpec` is a
`RunFacts` with the trainer's rules, and the rules (`rlshell.runners.rules`), which
the spec's module imports, take the facts from the spec and derive none again.
"""

from __future__ import annotations

from collections.abc import Mapping

from attrs import frozen

from rlshell.config import Config, PlacementEntry

__all__ = ["ProcessLayout", "RunFacts", "trains_critic"]


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


@frozen
class RunFacts:
    """What a run's config fixes, derived once (`RunFacts.of`): its ``layout``, whether it
    trains a ``critic``, and whether the rollout runs in the actor's processes."""

    config: Config
    layout: ProcessLayout
    critic: bool

    @classmethod
    def of(cls, config: Config) -> RunFacts:
        return cls(
            config=config,
            layout=ProcessLayout.of(config.cluster.component_placement),
            critic=trains_critic(config),
        )

    @property
    def rollout_in_actor(self) -> bool:
        """Whether one placement key names both the actor and the rollout."""
        return self.layout.shared("actor", "rollout")

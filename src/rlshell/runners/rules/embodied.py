"""What the embodied trainers accept: their own rules and the keys they leave unread.

`CollocatedPPORules`, `PipelinedPPORules` and `SACRules` are the halves of
`rlshell.runners.embodied_ppo.CollocatedPPOTrainer`,
`rlshell.runners.embodied_pipeline.PipelinedPPOTrainer` and
`rlshell.runners.sac.SACTrainer` that validation reads
(`rlshell.runners.rules`): they import none of the trainers' workers.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from rlcore.registry import ADVANTAGES, POLICY_LOSSES
from rlshell.cluster.placement import PlacementPlan
from rlshell.config import Config, OptimConfig
from rlshell.hyperparameters import LOSS_KEYS
from rlshell.rlinf_plugins import RLinfAdvantage
from rlshell.runners.facts import RunFacts
from rlshell.runners.offload import not_offloading_problems
from rlshell.runners.unread import (
    compile_unread,
    embodied_unread,
    ppo_update_unread,
    sac_unread,
    stages_unread,
)

__all__ = [
    "COLLOCATED_EXAMPLE",
    "HYBRID_EXAMPLE",
    "CollocatedPPORules",
    "PipelinedPPORules",
    "SACRules",
    "actor_share_problems",
    "ppo_problems",
    "ppo_unread",
]

COLLOCATED_EXAMPLE = '{"actor,rollout,env": "0:0-1"}'
HYBRID_EXAMPLE = '{"actor": "0:0-1", "rollout": "0:0", "env": "0:0"}'
_TRIO = ("actor", "rollout", "env")


def ppo_problems(config: Config, who: str) -> list[str]:
    """What both embodied PPO trainers refuse: offloading; fp16 (their update neither scales
    the loss nor goes on after an overflow); a policy loss that needs a proximal policy (none
    is kept); an advantage that needs values without a critic."""
    problems = not_offloading_problems(config, who)
    if config.actor.backend == "fsdp" and config.actor.fsdp_config.mixed_precision == "fp16":
        problems.append(
            f"actor.fsdp_config.mixed_precision: 'fp16' needs the loss scaled and a step whose "
            f"gradients overflow skipped, which {who}'s update does not do (the reasoning, "
            "critic and SFT updates do); use 'bf16' or 'fp32'"
        )
    algorithm = config.algorithm
    loss, adv = algorithm.loss_type, algorithm.adv_type
    if loss in POLICY_LOSSES and "proximal_logprobs" in POLICY_LOSSES.needs(loss):
        problems.append(
            f"algorithm.loss_type: '{loss}' needs a proximal policy's log-probabilities "
            f"(decoupled PPO, an asynchronous reasoning run's); {who} acts and trains with "
            "the same policy module and keeps none. Choose a loss that does not, e.g. 'ppo'"
        )
    if adv != "gae" and adv in ADVANTAGES and _requires_values(adv):
        problems.append(
            f"algorithm.adv_type: '{adv}' requires the critic's values, and {who} trains a "
            "value head only with 'gae' (any other estimator scores group-seeded episodes "
            "without one, rlshell.workers.embodied_grpo); give its values argument a "
            "default of None or use 'gae'"
        )
    return problems


def _requires_values(adv_type: str) -> bool:
    """Whether the advantage estimator ``adv_type`` cannot run without values: an RLinf-style
    plug-in (`rlshell.rlinf_plugins`) that names them without a default."""
    entry = ADVANTAGES.get(adv_type)
    return isinstance(entry, RLinfAdvantage) and "values" in entry.signature.required


def ppo_unread(facts: RunFacts, who: str) -> dict[str, str]:
    """What both embodied PPO trainers leave unread (`rlshell.runners.unread`); of the policy
    loss's clip settings, those the registered loss does not read (`Registry.reads`)."""
    config, critic = facts.config, facts.critic
    unread = {
        **embodied_unread(config, who),
        **sac_unread(who),
        **ppo_update_unread(config, critic, who),
    }
    loss = config.algorithm.loss_type
    for key in ("algorithm.clip_high", "algorithm.dual_clip"):
        del unread[key]  # the update hands them to the policy loss
    unread["algorithm.loss_agg_mode"] = (
        f"{who}'s policy loss (algorithm.loss_type) sees samples of one step each: there are "
        "no tokens to aggregate"
    )
    unread["algorithm.behavior_weight_cap"] = (
        f"caps decoupled PPO's behaviour weights in the reasoning runner; {who} keeps no "
        "proximal policy to weigh against"
    )
    if loss in POLICY_LOSSES:
        ignored = POLICY_LOSSES.ignores(loss)
        for key, hyperparameter in LOSS_KEYS.items():
            if hyperparameter in ignored and key not in unread:
                unread[key] = (
                    f"the '{loss}' policy loss (algorithm.loss_type) does not use "
                    f"{hyperparameter}; leave it unset"
                )
    return unread


def actor_share_problems(config: Config, ranks: int) -> list[str]:
    """Each of the actor's ``ranks`` trains on an equal share of ``env.num_envs`` envs,
    whose samples must fill ``algorithm.num_minibatches``."""
    problems = []
    if config.env.num_envs % ranks:
        problems.append(
            f"env.num_envs: {config.env.num_envs} envs do not split evenly over the actor's "
            f"{ranks} ranks"
        )
    samples = config.env.num_envs // ranks * config.runner.rollout_steps
    if config.algorithm.num_minibatches > samples:
        problems.append(
            f"algorithm.num_minibatches: {config.algorithm.num_minibatches} minibatches of a "
            f"rank's {samples} samples per step (env.num_envs / ranks × runner.rollout_steps)"
        )
    return problems


SAC_EXAMPLE = '{"actor": "0", "rollout,env": "0"}'
# The registry names both PPO trainers build.
_PPO_REGISTERED = (
    "actor.model.model_type",
    "algorithm.adv_type",
    "algorithm.loss_type",
    "env.env_type",
)


class CollocatedPPORules:
    """What embodied PPO with env, rollout and actor in the same processes may ask for."""

    trainer_name: ClassVar[str] = "CollocatedPPOTrainer"
    registered_names: ClassVar[tuple[str, ...]] = _PPO_REGISTERED

    @classmethod
    def problems(cls, facts: RunFacts, plan: PlacementPlan | None) -> list[str]:
        config = facts.config
        layout = facts.layout
        keys = [layout.key_of(name) for name in _TRIO]
        if None not in keys and len(set(keys)) == 2:  # a missing one is a missing placement
            grouped = next(key for key in keys if keys.count(key) == 2)
            alone = next(name for name, key in zip(_TRIO, keys, strict=True) if key != grouped)
            # Nothing else is worth checking against a layout no trainer runs.
            return [
                f"cluster.component_placement: the embodied PPO runner places env, rollout "
                f"and actor either all under one key (collocated, e.g. {COLLOCATED_EXAMPLE}) "
                f"or each under its own (hybrid, pipelined, e.g. {HYBRID_EXAMPLE}); "
                f"'{grouped}' groups two of them apart from '{alone}'"
            ]
        problems = []
        if plan is not None:
            ranks = len(plan.component("actor").workers)
            problems += actor_share_problems(config, ranks)
            for key, on in (
                ("actor.compile", config.actor.compile),
                ("rollout.compile", config.rollout.compile),
            ):
                if on and ranks != 1:
                    what = "update" if key == "actor.compile" else "rollout call"
                    problems.append(
                        f"{key}: the compiled {what} needs one actor rank (an unsharded "
                        f"policy); got {ranks}. Set {key}=false or place the actor on one "
                        'process, e.g. {"actor,rollout,env": "0:0"}'
                    )
        if config.actor.compile and config.algorithm.adv_type != "gae":
            problems.append(
                f"actor.compile: compiles PPO's update with algorithm.adv_type 'gae'; got "
                f"'{config.algorithm.adv_type}', whose windows vary in size. Set "
                "actor.compile=false"
            )
        if config.actor.compile and config.algorithm.loss_type != "ppo":
            problems.append(
                f"actor.compile: compiles PPO's update with algorithm.loss_type 'ppo' (traced "
                f"once, on fake tensors); got '{config.algorithm.loss_type}', which the "
                "update calls eagerly. Set actor.compile=false"
            )
        problems += ppo_problems(config, "the embodied PPO runner")
        return problems

    @classmethod
    def unread(cls, facts: RunFacts) -> dict[str, str]:
        config = facts.config
        key = facts.layout.key_of("actor")
        return {
            **ppo_unread(facts, "the embodied PPO runner"),
            "rollout.precision": (
                f"'{key}' places the rollout in the actor's processes, where it acts with the "
                "actor's own module (in actor.model.precision); leave it null"
            ),
            "rollout.pipeline_stage_num": (
                f"{config.rollout.pipeline_stage_num} stages pipeline env workers and rollout "
                f"workers of their own, but '{key}' places env, rollout and actor in the same "
                f"processes; use 1 there, or the hybrid placement, e.g. {HYBRID_EXAMPLE}"
            ),
        }


class PipelinedPPORules:
    """What embodied PPO with env, rollout and actor groups of their own may ask for."""

    trainer_name: ClassVar[str] = "PipelinedPPOTrainer"
    registered_names: ClassVar[tuple[str, ...]] = _PPO_REGISTERED

    @classmethod
    def problems(cls, facts: RunFacts, plan: PlacementPlan | None) -> list[str]:
        """The hybrid placement's sizes: envs split evenly over env workers, stages and actor
        ranks, no more rollout workers than env workers, and GAE."""
        config = facts.config
        problems = ppo_problems(config, "the pipelined embodied PPO runner")
        if config.env.on_failure == "reset":
            problems.append(
                "env.on_failure: 'reset' drops a failed env step and takes it again, and the "
                "hybrid placement's rollout workers have already recorded it; stop on a "
                "failure ('stop') or run with env, rollout and actor under one key, e.g. "
                f"{COLLOCATED_EXAMPLE}"
            )
        if config.algorithm.adv_type != "gae":
            problems.append(
                f"algorithm.adv_type: the hybrid placement trains PPO with GAE; "
                f"'{config.algorithm.adv_type}' (group-normalised episode returns) runs with "
                f"env, rollout and actor under one key, e.g. {COLLOCATED_EXAMPLE}"
            )
        if plan is None:
            return problems
        env_workers = len(plan.component("env").workers)
        rollout_workers = len(plan.component("rollout").workers)
        stages = config.rollout.pipeline_stage_num
        num_envs = config.env.num_envs
        if rollout_workers > env_workers:
            problems.append(
                f"cluster.component_placement: {rollout_workers} rollout workers for "
                f"{env_workers} env workers; rollout worker r acts for env workers r, "
                f"r + {rollout_workers}, ..., so some would idle: place at most {env_workers}"
            )
        if num_envs % env_workers:
            problems.append(
                f"env.num_envs: {num_envs} envs do not split evenly over the {env_workers} env "
                "workers"
            )
        elif (num_envs // env_workers) % stages:
            problems.append(
                f"rollout.pipeline_stage_num: an env worker's {num_envs // env_workers} envs do "
                f"not split evenly into {stages} stages"
            )
        problems += actor_share_problems(config, len(plan.component("actor").workers))
        return problems

    @classmethod
    def unread(cls, facts: RunFacts) -> dict[str, str]:
        config = facts.config
        unread = {
            **ppo_unread(facts, "the pipelined embodied PPO runner"),
            **compile_unread(
                "only the collocated placement (env, rollout and actor in the same processes, "
                f"e.g. {COLLOCATED_EXAMPLE}) reads it; the hybrid placement runs eager"
            ),
        }
        del unread["runner.mode"]  # this runner has the asynchronous mode
        if config.runner.mode == "async":
            del unread["algorithm.max_staleness"]
        else:
            unread["algorithm.max_staleness"] = (
                "bounds how far runner.mode='async' lets the env and rollout workers run ahead "
                "of the update; runner.mode is 'sync'"
            )
        return unread


class SACRules:
    """What an SAC run (env collectors and one learner) may ask for."""

    trainer_name: ClassVar[str] = "SACTrainer"
    registered_names: ClassVar[tuple[str, ...]] = ("actor.model.model_type", "env.env_type")

    @classmethod
    def problems(cls, facts: RunFacts, plan: PlacementPlan | None) -> list[str]:
        config = facts.config
        layout = facts.layout
        problems = []
        if layout.key_of("rollout") != layout.key_of("env"):
            problems.append(
                "cluster.component_placement: SAC's env workers step the policy themselves; "
                f"place 'rollout' and 'env' under one key, e.g. {SAC_EXAMPLE}"
            )
        if layout.key_of("actor") is not None and layout.shared("actor", "env"):
            problems.append(
                "cluster.component_placement: SAC runs its learner ('actor') in a process of its "
                "own beside the env workers, so that stepping and training overlap; give it a "
                f"key of its own, e.g. {SAC_EXAMPLE}"
            )
        problems += not_offloading_problems(config, "SAC")
        sac = config.algorithm.sac
        if sac.learning_starts < sac.batch_size:
            problems.append(
                f"algorithm.sac.learning_starts: the first update samples batch_size="
                f"{sac.batch_size} transitions, so at least that many must be collected first, "
                f"got {sac.learning_starts}"
            )
        if sac.replay_size < sac.batch_size:
            problems.append(
                f"algorithm.sac.replay_size: {sac.replay_size} is smaller than batch_size "
                f"{sac.batch_size}"
            )
        if plan is not None:
            learners = len(plan.component("actor").workers)
            collectors = len(plan.component("env").workers)
            if learners != 1:
                problems.append(
                    "cluster.component_placement: SAC's learner ('actor') runs in one process, "
                    f"got {learners}"
                )
            if config.env.num_envs % collectors:
                problems.append(
                    f"env.num_envs: {config.env.num_envs} envs do not split evenly over the "
                    f"{collectors} env workers"
                )
        return problems

    @classmethod
    def unread(cls, facts: RunFacts) -> dict[str, str]:
        config = facts.config
        unread = {
            **compile_unread("SAC does not read it"),
            **stages_unread(config, "SAC"),
            **embodied_unread(config, "SAC"),
            "actor.backend": "SAC's learner trains in plain torch in one process; "
            "actor.backend picks the other runners' training backend",
            "actor.fsdp_config": "SAC's learner is one process in plain torch: FSDP shards and "
            "casts nothing",
            "actor.model.gradient_checkpointing": "SAC's learner keeps every activation (its "
            "MLPs are small)",
            "rollout.precision": "SAC's env workers act with the learner's policy as it sends "
            "it (actor.model.precision); leave it null",
        }
        own = (
            "SAC's learner makes its own Adam optimizers at actor.optim.lr (policy), "
            "algorithm.sac.q_lr and algorithm.sac.alpha_lr, without clipping or schedule"
        )
        for field in attrs.fields(OptimConfig):
            if field.name != "lr":
                unread[f"actor.optim.{field.name}"] = own
        losses = (
            "SAC trains with its own losses (rlcore's sac_*, set by algorithm.sac.* and "
            "algorithm.gamma); this key sets PPO's or the reasoning runner's"
        )
        for key in (
            "adv_type",
            "group_size",
            "clip_low",
            "clip_high",
            "dual_clip",
            "loss_agg_mode",
            "entropy_coef",
            "lam",
            "baseline_form",
            "ppo_epochs",
            "num_minibatches",
            "vf_coef",
            "value_clip",
            "norm_adv",
            "norm_reward",
            "target_kl",
        ):
            unread[f"algorithm.{key}"] = losses
        return unread

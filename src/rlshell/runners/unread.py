"""The keys a run does not read, each with the reason: what validation refuses when set.

A key set to anything but its default where the run does not read it is
refused before anything starts (`rlshell.runners.validation.unread_problems`):
a key accepted and ignored is a bug. Each trainer declares its own
(`rlshell.runners.trainer.Trainer.unread`) from the pieces here;
`rlshell.runners.validation.unread_keys` holds the rules that depend on
other settings whatever the trainer (``checkpoint.keep_last`` with
``checkpoint.interval`` 0, ...). A key path names a section when it ends
there (``"reward"`` covers every ``reward.*`` key).

tests/shell/test_config_reads.py checks these against what real runs read
(`rlshell.config.tracing`).
"""

from __future__ import annotations

from typing import Any

from rlcore.registry import ADVANTAGES, POLICY_LOSSES, Registry
from rlshell.config import Config
from rlshell.hyperparameters import ESTIMATOR_KEYS, LOSS_KEYS

__all__ = [
    "compile_unread",
    "embodied_unread",
    "env_unread",
    "hyperparameters_unread",
    "ppo_update_unread",
    "reference_unread",
    "sac_unread",
    "stages_unread",
]


def hyperparameters_unread(config: Config) -> dict[str, str]:
    """The ``algorithm`` keys the chosen estimator and policy loss do not use.

    Each registry entry says which hyperparameters it reads
    (`rlcore.registry.Registry.reads`); one that does not say reads them all.
    """
    algorithm = config.algorithm
    unread: dict[str, str] = {}
    chosen: list[tuple[str, str, Registry[Any], dict[str, str]]] = [
        ("algorithm.adv_type", algorithm.adv_type, ADVANTAGES, ESTIMATOR_KEYS),
        ("algorithm.loss_type", algorithm.loss_type, POLICY_LOSSES, LOSS_KEYS),
    ]
    for name_key, name, registry, keys in chosen:
        if name not in registry:
            continue  # an unknown name is its own problem
        ignored = registry.ignores(name)
        for key, hyperparameter in keys.items():
            if hyperparameter in ignored:
                unread[key] = (
                    f"the '{name}' {registry.kind} ({name_key}) does not use "
                    f"{hyperparameter}; leave it unset"
                )
    if algorithm.adv_type == "reinforce_pp_baseline" and algorithm.baseline_form == "score":
        # What the registry's static `reads` cannot say: this form of the estimator never
        # discounts (rlcore's adapter refuses gamma != 1 with it too).
        unread["algorithm.gamma"] = (
            "the 'reinforce_pp_baseline' advantage estimator with algorithm.baseline_form="
            "'score' centres each row's undiscounted score (verl's form), so it does not use "
            "gamma; leave it unset or set algorithm.baseline_form='reward_to_go'"
        )
    return unread


def env_unread(config: Config) -> dict[str, str]:
    """The ``env`` keys the chosen env type's builder does not read (`rlshell.envs.ENVS`)."""
    from rlshell.envs import ENVS

    unread: dict[str, str] = {}
    if config.env.on_failure == "stop":
        unread["env.max_consecutive_failures"] = (
            "bounds how many failed env steps in a row env.on_failure='reset' rebuilds the "
            "envs after; env.on_failure is 'stop', so the first failure stops the run"
        )
    if not config.env.isolate:
        unread["env.memory_mb"] = (
            "limits each env copy's own process; env.isolate is false, so the envs step in "
            "the worker's process, whose memory torch shares: set env.isolate=true"
        )
    env_type = config.env.env_type
    if env_type is None or env_type not in ENVS:
        return unread  # a missing or unknown type is its own problem
    for key in sorted(ENVS.ignores(env_type)):
        unread[f"env.{key}"] = f"the '{env_type}' env type (env.env_type) does not read it"
    return unread


def compile_unread(reason: str) -> dict[str, str]:
    """``actor.compile`` and ``rollout.compile`` where a run does not read them (``reason``)."""
    return {
        f"{key}.compile": f"compiles embodied PPO's {what} step; {reason}. Set {key}.compile=false"
        for key, what in (("actor", "update"), ("rollout", "rollout"))
    }


def stages_unread(config: Config, who: str) -> dict[str, str]:
    """``rollout.pipeline_stage_num`` where ``who`` (a runner) does not pipeline."""
    return {
        "rollout.pipeline_stage_num": (
            f"{config.rollout.pipeline_stage_num} stages pipeline embodied PPO's env and "
            f"rollout workers; {who} does not use it (leave it at 1)"
        )
    }


def reference_unread(who: str) -> dict[str, str]:
    """The KL term's keys where ``who`` runs no reference policy."""
    reason = f"{who} runs no reference policy, so there is no KL term"
    return {
        "algorithm.kl_kind": f"{reason} to estimate",
        "algorithm.kl_in_reward": f"{reason} to put in the reward",
        "algorithm.kl_target": f"{reason} to control",
        "algorithm.kl_horizon": f"{reason} to control",
        "actor.reference_cpus_per_worker": f"{reason} and no reference worker to size",
    }


def sac_unread(who: str) -> dict[str, str]:
    """``algorithm.sac`` where ``who`` does not train with SAC."""
    return {
        "algorithm.sac": (
            f"configures soft actor-critic (runner.runner_type='embodied' with "
            f"algorithm.loss_type='sac'); {who} does not train with it"
        )
    }


def embodied_unread(config: Config, who: str) -> dict[str, str]:
    """What no embodied trainer reads: the reasoning runner's prompts, rewards, sampling and
    text-generation engine, evaluation during training, the reference, and the env keys
    its env type ignores."""
    generation = f"{who} acts with the policy's predict_action_batch, not a text-generation engine"
    unread = {
        "reward": f"{who} scores with the env's rewards; reward.* configures the reasoning "
        "runner's reward workers",
        "data": f"{who} steps environments (env.*); data.* configures the reasoning runner's "
        "prompts",
        "runner.prompts_per_step": f"{who} steps env.num_envs envs runner.rollout_steps times "
        "a step; prompts are the reasoning runner's",
        "runner.eval_interval": f"{who} does not evaluate during training; evaluate a "
        "checkpoint with python -m rlshell.evaluate",
        "algorithm.kl_coef": f"{who} runs no reference policy, so there is no KL term",
        "algorithm.old_logprobs": f"chooses the reasoning actor's π_old; {who} takes the "
        "rollout's log-probs of the same policy module",
        "algorithm.rollout_is": f"corrects the reasoning runner's sampler–trainer mismatch; "
        f"{who}'s rollout runs the actor's own policy module",
        "algorithm.rollout_is_threshold": f"caps the reasoning runner's rollout importance "
        f"weights; {who} has none",
        "algorithm.baseline_form": "chooses the reasoning runner's REINFORCE++-baseline form; "
        f"{who} calls its advantage estimator with rlcore's defaults",
        "rollout.cpu_kv_cache_mb": generation,
        "actor.micro_batch_max_tokens": f"budgets the reasoning actor's token micro-batches; "
        f"{who} splits its update by algorithm.num_minibatches",
        "critic": f"configures the reasoning runner's value model (algorithm.adv_type 'gae'); "
        f"{who}'s policy carries its own value head",
        "actor.mini_batch_size": f"sizes the reasoning actor's mini-batches in prompts; {who} "
        "splits each epoch by algorithm.num_minibatches",
        "algorithm.behavior_weight_cap": f"caps decoupled PPO's behaviour weights in the "
        f"reasoning runner; {who}'s update is rlcore's ppo_policy_loss",
        "algorithm.dynamic_sampling": f"resamples prompts whose samples all score alike in "
        f"the reasoning runner; {who} steps environments",
        "algorithm.max_sampling_rounds": f"bounds the reasoning runner's dynamic sampling; "
        f"{who} steps environments",
        "algorithm.overlong_buffer": f"penalises overlong responses in the reasoning runner; "
        f"{who}'s episodes end at env.max_episode_steps",
        "algorithm.overlong_penalty_factor": f"scales the reasoning runner's overlong penalty; "
        f"{who} has none",
        "actor.logprob_chunk_size": f"chunks the reasoning actor's vocabulary log-probs; {who} "
        "reads no token logits",
        "actor.share_prompt_forward": f"shares a prompt's forward among its samples in the "
        f"reasoning actor; {who} has no prompts",
        "actor.pack_sequences": f"packs the reasoning actor's token sequences without padding; "
        f"{who} has no token sequences",
        "rollout.backend": generation,
        "rollout.temperature": generation,
        "rollout.top_p": generation,
        "rollout.top_k": generation,
        "rollout.max_new_tokens": generation,
        "rollout.min_new_tokens": generation,
        "rollout.gpu_memory_utilization": generation,
        "rollout.weight_sync": f"how the reasoning actor syncs a text-generation engine; {who} "
        "hands the policy's state to its rollout its own way",
        "rollout.bucket_size_mb": f"sizes the reasoning actor's weight-sync buckets; {who} "
        "hands the policy's state to its rollout its own way",
    }
    unread.update(reference_unread(who))
    unread.update(env_unread(config))
    hybrid = (
        "embodied PPO's hybrid placement (env, rollout and actor under keys of their own, "
        'e.g. {"actor": "0:0-1", "rollout": "0:0", "env": "0:0"})'
    )
    unread["runner.mode"] = f"{who} has no asynchronous mode; {hybrid} has one"
    unread["algorithm.max_staleness"] = (
        f"bounds an asynchronous run's staleness; {who} has no asynchronous mode, {hybrid} has"
    )
    return unread


def ppo_update_unread(config: Config, critic: bool, who: str) -> dict[str, str]:
    """What embodied PPO's update (`rlshell.workers.embodied_update`) does not read.

    It is rlcore's ``ppo_policy_loss`` with a symmetric clip of
    ``algorithm.clip_low`` on one sample per row (nothing to aggregate), a
    critic only with ``gae``, and the group estimators' advantages from
    undiscounted episode returns.
    """
    loss = f"{who}'s update is rlcore's ppo_policy_loss clipped symmetrically by algorithm.clip_low"
    unread = {
        "algorithm.clip_high": f"{loss}; set clip_low",
        "algorithm.dual_clip": f"{loss}, without a dual clip",
        "algorithm.loss_agg_mode": f"{loss} over samples of one step each: there are no tokens "
        "to aggregate",
    }
    adv_type = config.algorithm.adv_type
    if not critic:
        no_critic = f"'{adv_type}' (algorithm.adv_type) trains no critic"
        unread["algorithm.vf_coef"] = f"{no_critic}: there is no value loss to weight"
        unread["algorithm.value_clip"] = f"{no_critic}: there is no value loss to clip"
        unread["algorithm.lam"] = f"{no_critic}: GAE's λ is not used"
        unread["algorithm.bootstrap_at_done"] = (
            f"{no_critic}: no value target bootstraps after an episode's end"
        )
        if not config.algorithm.norm_reward:
            unread["algorithm.gamma"] = (
                f"{who} scores each episode's undiscounted return with '{adv_type}' "
                "(rlshell.workers.embodied_grpo); γ is read only by algorithm.norm_reward's "
                "return scaler"
            )
    else:
        unread["algorithm.group_size"] = (
            f"'{adv_type}' (algorithm.adv_type) compares no groups of envs; group_size is read "
            "by the group estimators (grpo, dr_grpo, rloo)"
        )
    return unread


def chat_markers_unread(config: Config) -> dict[str, str]:
    """``agent.result_start`` / ``result_end`` where ``data.chat_template`` renders the turns:
    a tool's output is then the template's tool turn."""
    if not config.data.chat_template:
        return {}
    reason = (
        "wraps a tool's output in plain-text conversations; with data.chat_template a tool's "
        "output is the template's tool turn"
    )
    return {"agent.result_start": reason, "agent.result_end": reason}


def chat_template_problems(config: Config) -> list[str]:
    """``data.chat_template`` on a model built here, whose character tokenizer has none."""
    model = config.actor.model
    if config.data.chat_template and model.path is None and model.tokenizer_path is None:
        return [
            "data.chat_template: the model is built here (actor.model.path is unset) with "
            "the character tokenizer, which has no chat template; leave data.chat_template "
            "false, or train a pretrained model whose tokenizer has one"
        ]
    return []

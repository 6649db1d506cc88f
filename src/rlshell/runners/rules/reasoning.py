"""What the reasoning trainer accepts: its own rules and the keys it leaves unread.

`ReasoningRules` is `rlshell.runners.reasoning.ReasoningTrainer`'s half that
validation reads (`rlshell.runners.rules`): it imports neither the trainer's
workers nor its tokenizer.
"""

from __future__ import annotations

from typing import ClassVar

from rlcore.registry import POLICY_LOSSES
from rlshell.cluster.placement import PlacementPlan
from rlshell.config import Config
from rlshell.engines.rollout import ROLLOUT_ENGINES
from rlshell.engines.training import TRAINING_BACKENDS, data_parallel_shares, pipeline_stages
from rlshell.runners.facts import RunFacts
from rlshell.runners.offload import offload_problems, plan_offload
from rlshell.runners.unread import (
    chat_markers_unread,
    chat_template_problems,
    compile_unread,
    hyperparameters_unread,
    reference_unread,
    sac_unread,
    stages_unread,
)

__all__ = ["UNSUPPORTED", "ReasoningRules", "optimizer_steps_per_batch"]

# What the reasoning trainer cannot feed a loss or estimator: values, teacher or proximal
# log-probs.
UNSUPPORTED = {
    "algorithm.adv_type": {"opd": "teacher log-probs"},
}


def optimizer_steps_per_batch(config: Config) -> int:
    """Optimizer steps the reasoning update makes per batch: ``algorithm.ppo_epochs`` ×
    (``runner.prompts_per_step`` / ``actor.mini_batch_size``)."""
    mini = config.actor.mini_batch_size or config.runner.prompts_per_step
    return config.algorithm.ppo_epochs * max(1, config.runner.prompts_per_step // mini)


class ReasoningRules:
    """What a reasoning run may ask for (`rlshell.runners.rules.TrainerRules`)."""

    trainer_name: ClassVar[str] = "ReasoningTrainer"
    registered_names: ClassVar[tuple[str, ...]] = (
        "actor.model.model_type",
        "algorithm.adv_type",
        "algorithm.loss_type",
        "reward.reward_type",
    )

    @classmethod
    def problems(cls, facts: RunFacts, plan: PlacementPlan | None) -> list[str]:
        config = facts.config
        algorithm = config.algorithm
        problems = []
        for key, unsupported in UNSUPPORTED.items():
            name = algorithm.adv_type if key.endswith("adv_type") else algorithm.loss_type
            if name in unsupported:
                problems.append(
                    f"{key}: '{name}' needs {unsupported[name]}, which the reasoning runner "
                    "does not compute"
                )
        if config.rollout.weight_sync == "shared":
            problems += _shared_weight_problems(facts)
        problems += _update_problems(config, plan)
        layout = facts.layout
        critic_key = layout.key_of("critic")
        if critic_key is not None and "," in critic_key:
            problems.append(
                f"cluster.component_placement.{critic_key}: the critic runs in processes of "
                "its own; give it a key of its own (it may name the actor's devices: "
                "{'critic': '0:0-1'})"
            )
        if plan is not None:
            problems += offload_problems(facts, plan)
        if config.runner.mode == "async":
            problems += _async_problems(facts, plan)
        problems += _agent_problems(config)
        problems += chat_template_problems(config)
        problems += _few_shot_problems(config)
        return problems

    @classmethod
    def unread(cls, facts: RunFacts) -> dict[str, str]:
        config = facts.config
        who = "the reasoning runner"
        gae = facts.critic
        no_critic = f"'{config.algorithm.adv_type}' (algorithm.adv_type) trains no critic"
        unread = {
            **compile_unread(f"{who} does not read it"),
            **stages_unread(config, who),
            **sac_unread(who),
            "env": f"{who} samples prompts (data.*); env.* configures the embodied runner's "
            "environments",
            "runner.rollout_steps": "env steps per env in an embodied step; a reasoning step is "
            "runner.prompts_per_step prompts × algorithm.group_size samples",
            "algorithm.num_minibatches": f"{who} splits each epoch into mini-batches of "
            "actor.mini_batch_size prompts",
            "algorithm.vf_coef": f"{who}'s critic has an optimizer of its own (critic.optim): "
            "a weight on its loss would only rescale its gradient",
            "algorithm.norm_adv": "standardises embodied PPO's minibatch advantages; "
            f"{who}'s advantages are algorithm.adv_type's",
            "algorithm.norm_reward": "scales embodied PPO's env rewards by a running return "
            f"std; {who}'s rewards are reward.reward_type's scores",
            "algorithm.target_kl": "stops embodied PPO's update early on its approximate KL; "
            f"{who} runs every algorithm.ppo_epochs epoch",
            "algorithm.bootstrap_at_done": "sets which ended env episodes a value target "
            f"bootstraps after (embodied PPO, SAC); {who}'s responses end with their last "
            "token",
            **hyperparameters_unread(config),
        }
        algorithm = config.algorithm
        if config.runner.mode == "sync":
            unread["algorithm.max_staleness"] = (
                "bounds how far runner.mode='async' lets the rollout run ahead of the update; "
                "runner.mode is 'sync'"
            )
        if not algorithm.dynamic_sampling:
            unread["algorithm.max_sampling_rounds"] = (
                "bounds dynamic sampling's rounds; algorithm.dynamic_sampling is off"
            )
        if algorithm.overlong_buffer is None:
            unread["algorithm.overlong_penalty_factor"] = (
                "scales DAPO's overlong penalty; algorithm.overlong_buffer is null, so there is "
                "none"
            )
        if not gae:
            unread["critic"] = f"{no_critic}; critic.* configures the value model of 'gae'"
            unread["algorithm.value_clip"] = f"{no_critic}: there is no value loss to clip"
        loss = config.algorithm.loss_type
        if _needs_proximal(loss):
            unread["algorithm.old_logprobs"] = (
                f"{loss} takes its ratio against the recomputed log-probs (the proximal "
                "policy) and weights by their ratio to the rollout's (the behaviour policy): it "
                "uses both, whatever old_logprobs says"
            )
        if algorithm.kl_coef > 0 and not algorithm.kl_in_reward:
            in_loss = "algorithm.kl_in_reward is off: the KL term is a loss of fixed weight"
            unread["algorithm.kl_target"] = f"steers the KL penalty in the reward; {in_loss}"
            unread["algorithm.kl_horizon"] = f"steers the KL penalty in the reward; {in_loss}"
        elif algorithm.kl_coef > 0 and algorithm.kl_target is None:
            unread["algorithm.kl_horizon"] = (
                "sets the adaptive KL controller's rate; algorithm.kl_target is null, so the "
                "penalty's coefficient is algorithm.kl_coef throughout"
            )
        if config.algorithm.kl_coef == 0:
            unread.update(reference_unread(f"with algorithm.kl_coef 0 {who}"))
            # (A backend that cannot pack refuses packing, and the shared prompt forward, on
            # its own terms.)
            backend = config.actor.backend
            packs = backend in TRAINING_BACKENDS and TRAINING_BACKENDS.get(backend).packs_sequences
            if config.actor.pack_sequences and packs:
                unread["actor.share_prompt_forward"] = (
                    "shares a prompt's forward among its samples; with actor.pack_sequences "
                    "the update's forward is packed and runs every row's prompt, and with "
                    "algorithm.kl_coef 0 there is no reference forward to share it in; leave it "
                    "at its default"
                )
        data = config.data
        if data.task == "arithmetic":
            generated = (
                "data.task is 'arithmetic', which generates its prompts; set data.task='file' "
                "to read files"
            )
            for key in ("train_path", "val_path", "prompt_key", "answer_key"):
                unread[f"data.{key}"] = generated
        else:
            files = f"describes the generated arithmetic task; data.task is '{data.task}'"
            for key in (
                "num_terms",
                "max_operand",
                "num_val",
                "num_train",
                "seed",
                "operator",
                "phrasing",
            ):
                unread[f"data.{key}"] = files
        if not data.chat_template:
            unread["data.system_prompt"] = (
                "is the system turn of the conversation data.chat_template renders each prompt "
                "in; data.chat_template is false, so prompts are given to the model as they are"
            )
            unread["data.few_shot"] = (
                "are turns of the conversation data.chat_template renders each prompt in; "
                "data.chat_template is false, so prompts are given to the model as they are"
            )
        if config.rollout.weight_sync == "shared":
            unread["rollout.bucket_size_mb"] = (
                "rollout.weight_sync 'shared' sends no weights: the engine generates with the "
                "actor's own module"
            )
        if config.agent.tools:
            unread.update(chat_markers_unread(config))
        return unread


def _async_problems(facts: RunFacts, plan: PlacementPlan | None) -> list[str]:
    """What ``runner.mode='async'`` cannot run: a rollout in the actor's processes (the
    same processes cannot generate while they train), rollout and actor taking turns on
    GPUs they share, and dynamic sampling (its extra rounds would wait for the update)."""
    config, layout = facts.config, facts.layout
    problems = []
    if layout.shared("actor", "rollout"):
        problems.append(
            f"runner.mode: 'async' generates while the actor trains, in other processes; "
            f"cluster.component_placement.{layout.key_of('rollout')} puts the rollout in the "
            "actor's. Give the rollout a key of its own, e.g. "
            '{"actor": "0:0", "rollout": "0:1", "reward": "0"}'
        )
    if plan is not None and plan_offload(facts, plan).any:
        problems.append(
            "runner.mode: 'async' runs the rollout during the update, and this plan has the "
            "actor and the rollout take turns on GPUs they share (rollout.offload); give them "
            "devices of their own"
        )
    if config.algorithm.dynamic_sampling:
        problems.append(
            "algorithm.dynamic_sampling: the asynchronous runner queues each step's rollout "
            "ahead, and dynamic sampling's further rounds are drawn once a step's scores are "
            "in; use runner.mode=sync with dynamic sampling"
        )
    return problems


def _agent_problems(config: Config) -> list[str]:
    """``agent.tools``: names the tool registry knows, a default tool among them, markers
    that cannot be confused, and what multi-turn rollouts do not combine with."""
    from rlshell.tools import TOOLS

    agent = config.agent
    if not agent.tools:
        return []
    problems = []
    for name in agent.tools:
        try:
            TOOLS.get(name)
        except KeyError as error:
            problems.append(f"agent.tools: {error.args[0]}")
    if agent.default_tool is not None and agent.default_tool not in agent.tools:
        problems.append(
            f"agent.default_tool: {agent.default_tool!r} is not one of agent.tools "
            f"{list(agent.tools)}"
        )
    markers = {
        "call_start": agent.call_start,
        "call_end": agent.call_end,
        "result_start": agent.result_start,
        "result_end": agent.result_end,
    }
    for key, marker in markers.items():
        if not marker:
            problems.append(f"agent.{key}: a marker cannot be empty")
    if len(set(markers.values())) < len(markers):
        problems.append(f"agent: the four markers must differ, got {markers}")
    if config.rollout.partial_rollouts:
        problems.append(
            "rollout.partial_rollouts: a multi-turn rollout (agent.tools) runs its turns as "
            "requests of their own; interrupting a turn is not built; set it to false"
        )
    return problems


def _update_problems(config: Config, plan: PlacementPlan | None) -> list[str]:
    """``actor.mini_batch_size`` against the batch and the actor's ranks; what the update
    cannot combine."""
    algorithm, actor, prompts = config.algorithm, config.actor, config.runner.prompts_per_step
    problems = []
    mini = actor.mini_batch_size
    if mini is not None and (mini > prompts or prompts % mini):
        problems.append(
            f"actor.mini_batch_size: mini-batches of {mini} prompts must split "
            f"runner.prompts_per_step ({prompts}) evenly, so that every optimizer step has "
            "the same size"
        )
    elif plan is not None and any(c.name == "actor" for c in plan.components):
        ranks = data_parallel_shares(actor, len(plan.component("actor").workers))
        rows = (mini or prompts) * algorithm.group_size
        if rows < ranks:
            problems.append(
                f"actor.mini_batch_size: a mini-batch of {mini or prompts} prompts × "
                f"{algorithm.group_size} samples has {rows} rows, fewer than the actor's "
                f"{ranks} data-parallel ranks; every rank needs a share"
            )
    if config.rollout.min_new_tokens > config.rollout.max_new_tokens:
        problems.append(
            f"rollout.min_new_tokens: {config.rollout.min_new_tokens} tokens at least cannot "
            f"fit rollout.max_new_tokens ({config.rollout.max_new_tokens}) at most"
        )
    buffer = algorithm.overlong_buffer
    if buffer is not None and buffer > config.rollout.max_new_tokens:
        problems.append(
            f"algorithm.overlong_buffer: the penalty ramps over the last L_cache={buffer} "
            f"tokens of rollout.max_new_tokens ({config.rollout.max_new_tokens}); it must not "
            "exceed them"
        )
    several = optimizer_steps_per_batch(config) > 1
    if several and pipeline_stages(actor) > 1:
        problems.append(
            "algorithm.ppo_epochs / actor.mini_batch_size: several optimizer steps per batch "
            "need the log-probs before the update, which the Megatron backend does not "
            "compute through a pipeline (pipeline_model_parallel_size > 1); use one step per "
            "batch or pipeline_model_parallel_size 1"
        )
    if algorithm.kl_in_reward and algorithm.kl_kind.endswith("+"):
        problems.append(
            f"algorithm.kl_kind: '{algorithm.kl_kind}' is straight-through, which changes the "
            "gradient of a KL loss; in the reward (kl_in_reward) there is no gradient: use "
            f"'{algorithm.kl_kind[:-1]}'"
        )
    if algorithm.kl_target is not None and algorithm.kl_in_reward:
        rows = config.runner.prompts_per_step * algorithm.group_size
        if rows >= 5 * algorithm.kl_horizon:
            problems.append(
                f"algorithm.kl_horizon: {rows} responses a step against a horizon of "
                f"{algorithm.kl_horizon} could scale β by 1 − 0.2·{rows}/{algorithm.kl_horizon}"
                " ≤ 0 in one step; make it longer"
            )
    loss = algorithm.loss_type
    if _needs_proximal(loss) and algorithm.rollout_is is not None:
        problems.append(
            f"algorithm.rollout_is: {loss} already weights each token by π_prox/μ "
            f"(recomputed over rollout log-probs), the correction '{algorithm.rollout_is}' "
            f"would apply a second time; cap {loss}'s weights with "
            "algorithm.behavior_weight_cap instead"
        )
    return problems


def _few_shot_problems(config: Config) -> list[str]:
    """``data.few_shot``: worked examples from a user turn to an assistant turn, so that the
    prompt's own user turn follows an answer."""
    turns = config.data.few_shot
    if not turns or not config.data.chat_template:
        return []
    roles = [role for role, _ in turns]
    if roles[0] != "user" or roles[-1] != "assistant":
        return [
            f"data.few_shot: the worked examples must start with a 'user' turn and end with an "
            f"'assistant' turn (the prompt's user turn follows them); got {roles}"
        ]
    return []


def _needs_proximal(loss: str) -> bool:
    """Whether the policy loss ``loss`` takes a proximal policy's log-probs (decoupled PPO:
    the recomputed ones) beside the behaviour policy's, by its registry entry's word."""
    return loss in POLICY_LOSSES and "proximal_logprobs" in POLICY_LOSSES.needs(loss)


def _shared_weight_problems(facts: RunFacts) -> list[str]:
    """``weight_sync='shared'``: the hf engine must live in the actor's processes, in its dtype."""
    config = facts.config
    rollout, actor_dtype = config.rollout, config.actor.fsdp_config.mixed_precision
    engine_dtype = rollout.precision or config.actor.model.precision
    problems = []
    engine = rollout.backend
    if engine in ROLLOUT_ENGINES and not ROLLOUT_ENGINES.get(engine).shares_actor_weights:
        able = [n for n in ROLLOUT_ENGINES.names() if ROLLOUT_ENGINES.get(n).shares_actor_weights]
        problems.append(
            f"rollout.weight_sync: 'shared' generates with the actor's own module, which only "
            f"the {' and '.join(able)} engine can do; the {engine} engine needs 'bucket' or "
            "'patch'"
        )
    layout = facts.layout
    key = layout.key_of("rollout")
    if key is not None and not layout.shared("actor", "rollout"):
        problems.append(
            f"rollout.weight_sync: 'shared' needs the rollout in the actor's processes "
            f"(one placement key such as 'actor,rollout'), but the rollout is placed by "
            f"'{key}'; use 'bucket' or 'patch' for a rollout of its own"
        )
    if engine_dtype != actor_dtype:
        problems.append(
            f"rollout.precision: 'shared' generates with the actor's gathered parameters, "
            f"which are {actor_dtype} (actor.fsdp_config.mixed_precision), not {engine_dtype} "
            "(rollout.precision, else actor.model.precision); make them agree or use "
            "'bucket'/'patch' to cast on sync"
        )
    return problems

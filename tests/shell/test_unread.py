"""Keys a run does not read are refused when set, each with its reason (`rlshell.runners.unread`,
`rlshell.runners.validation.unread_keys`).

tests/shell/test_config_reads.py checks the declarations against what real
runs read; these are the rules in settings those runs do not cover, and the
words of a few.
"""

from __future__ import annotations

import pytest

from rlshell.config import ConfigError
from rlshell.runners.validation import load_config

GRPO = "configs/grpo.py"
CARTPOLE = "configs/ppo_cartpole.py"
PENDULUM = "configs/sac_pendulum.py"


def refusals(source: str, *overrides: str, for_run: bool = False) -> list[str]:
    try:
        load_config(source, list(overrides), for_run=for_run)
    except ConfigError as error:
        return error.problems
    return []


def keys_of(problems: list[str]) -> list[str]:
    return [problem.split(":")[0] for problem in problems]


def test_an_estimator_or_loss_that_ignores_a_hyperparameter_is_named() -> None:
    assert refusals(GRPO, "algorithm.gamma=0.9", "algorithm.lam=0.9") == [
        "algorithm.gamma: the 'grpo' advantage estimator (algorithm.adv_type) does not use "
        "gamma; leave it unset",
        "algorithm.lam: the 'grpo' advantage estimator (algorithm.adv_type) does not use lam; "
        "leave it unset",
    ]
    assert refusals(GRPO, "algorithm.adv_type=reinforce_pp", "algorithm.gamma=0.9") == []
    assert keys_of(
        refusals(
            GRPO,
            "algorithm.adv_type=rloo",
            "algorithm.loss_type=vanilla",
            "algorithm.clip_low=0.1",
            "algorithm.dual_clip=3",
        )
    ) == ["algorithm.clip_low", "algorithm.dual_clip"]
    (gspo,) = refusals(GRPO, "algorithm.loss_type=gspo", "algorithm.dual_clip=3")
    assert gspo.startswith("algorithm.dual_clip: the 'gspo' policy loss (algorithm.loss_type)")


def test_reinforce_pp_baselines_form_is_read_by_that_estimator_alone() -> None:
    """``algorithm.baseline_form`` is read by ``reinforce_pp_baseline``; its ``score`` form
    (verl's) never discounts, so ``algorithm.gamma`` is refused beside it."""
    rpp = "algorithm.adv_type=reinforce_pp_baseline"
    assert refusals(GRPO, "algorithm.baseline_form=score") == [
        "algorithm.baseline_form: the 'grpo' advantage estimator (algorithm.adv_type) does not "
        "use baseline_form; leave it unset",
    ]
    assert refusals(GRPO, rpp, "algorithm.baseline_form=score") == []
    assert refusals(GRPO, rpp, "algorithm.gamma=0.9") == []
    assert refusals(GRPO, rpp, "algorithm.baseline_form=score", "algorithm.gamma=0.9") == [
        "algorithm.gamma: the 'reinforce_pp_baseline' advantage estimator with "
        "algorithm.baseline_form='score' centres each row's undiscounted score (verl's form), "
        "so it does not use gamma; leave it unset or set algorithm.baseline_form='reward_to_go'",
    ]
    (embodied,) = refusals(CARTPOLE, "algorithm.baseline_form=score")
    assert embodied.startswith("algorithm.baseline_form: chooses the reasoning runner's")
    (sac,) = refusals(PENDULUM, "algorithm.baseline_form=score")
    assert sac.startswith("algorithm.baseline_form: SAC trains with its own losses")


def test_an_estimator_registered_without_saying_is_taken_to_read_everything() -> None:
    from rlcore.advantages import ADVANTAGES

    ADVANTAGES.register("reads_all", ADVANTAGES.get("grpo"))
    try:
        assert refusals(GRPO, "algorithm.adv_type=reads_all", "algorithm.gamma=0.9") == []
    finally:
        ADVANTAGES.unregister("reads_all")


@pytest.mark.parametrize(
    ("overrides", "keys"),
    [
        (
            ["data.prompt_key=question", "data.answer_key=solution"],
            ["data.prompt_key", "data.answer_key"],
        ),
        (
            ["data.task=file", "data.train_path=train.jsonl", "data.num_terms=2", "data.seed=3"],
            ["data.num_terms", "data.seed"],
        ),
        (["logger.wandb_project=rl"], ["logger.wandb_project"]),
        (
            [
                "actor.model.lora_rank=16",
                "actor.model.lora_alpha=32",
                'actor.model.lora_target_modules=["q_proj"]',
            ],
            ["actor.model.lora_rank", "actor.model.lora_alpha", "actor.model.lora_target_modules"],
        ),
        (["rollout.gpu_memory_utilization=0.9"], ["rollout.gpu_memory_utilization"]),
        (["checkpoint.interval=0", "checkpoint.keep_last=5"], ["checkpoint.keep_last"]),
        (
            ["checkpoint.interval=0", "checkpoint.save_on_interrupt=false"],
            ["checkpoint.save_on_interrupt"],
        ),
        (["algorithm.kl_kind=k1"], ["algorithm.kl_kind"]),
        (["rollout.weight_sync=shared", "rollout.bucket_size_mb=8"], ["rollout.bucket_size_mb"]),
        (["runner.rollout_steps=64", "env.num_envs=4"], ["env.num_envs", "runner.rollout_steps"]),
        (["algorithm.num_minibatches=2", "algorithm.norm_adv=false"], None),
        (
            ["actor.mini_batch_size=4", "algorithm.behavior_weight_cap=3"],
            ["algorithm.behavior_weight_cap"],
        ),
        (["algorithm.sac.tau=0.01"], ["algorithm.sac.tau"]),
    ],
)
def test_the_reasoning_runner_refuses_what_it_does_not_read(
    overrides: list[str], keys: list[str] | None
) -> None:
    found = keys_of(refusals(GRPO, *overrides))
    expected = keys if keys is not None else [o.split("=")[0] for o in overrides]
    assert sorted(found) == sorted(expected)


def test_keys_read_in_these_settings_are_accepted() -> None:
    accepted = [
        ['logger.backends=["console","wandb"]', "logger.wandb_project=rl"],
        [
            "actor.model.is_lora=true",
            "actor.model.lora_rank=16",
            "actor.model.lora_alpha=32",
            'actor.model.lora_target_modules=["q_proj","v_proj"]',
        ],
        ["algorithm.kl_coef=0.1", "algorithm.kl_kind=k1"],
        ["checkpoint.keep_last=5"],
        ["checkpoint.interval=10", "checkpoint.save_on_interrupt=false"],
        # A GPU config planned for vLLM (a dry run) reads its memory share.
        ["cluster.simulate=1x8", "rollout.backend=vllm", "rollout.gpu_memory_utilization=0.9"],
    ]
    for overrides in accepted:
        assert refusals(GRPO, *overrides) == [], overrides


def test_packing_on_its_own_is_accepted_and_leaves_the_shared_prompt_forward_unread() -> None:
    # share_prompt_forward defaults to true: turning packing on asks for nothing else.
    assert refusals(GRPO, "actor.pack_sequences=true") == []
    # With packing, only the reference's forward (the KL term) shares prompts.
    assert refusals(GRPO, "actor.pack_sequences=true", "actor.share_prompt_forward=false") == [
        "actor.share_prompt_forward: shares a prompt's forward among its samples; with "
        "actor.pack_sequences the update's forward is packed and runs every row's prompt, and "
        "with algorithm.kl_coef 0 there is no reference forward to share it in; leave it at its "
        "default"
    ]
    with_kl = ["actor.pack_sequences=true", "algorithm.kl_coef=0.1"]
    assert refusals(GRPO, *with_kl, "actor.share_prompt_forward=false") == []
    assert refusals(GRPO, "actor.share_prompt_forward=false") == []


@pytest.mark.parametrize(
    ("override", "reason"),
    [
        ("reward.timeout_s=10", "scores with the env's rewards"),
        ("reward.max_failed_steps=5", "scores with the env's rewards"),
        ("data.num_val=10", "steps environments (env.*)"),
        ("rollout.backend=vllm", "acts with the policy's predict_action_batch"),
        ("rollout.temperature=0.5", "acts with the policy's predict_action_batch"),
        ("runner.prompts_per_step=4", "prompts are the reasoning runner's"),
        ("runner.eval_interval=10", "python -m rlshell.evaluate"),
        ("algorithm.kl_coef=0.1", "no reference policy"),
        ("algorithm.behavior_weight_cap=2", "caps decoupled PPO's behaviour weights"),
        ("algorithm.group_size=4", "compares no groups of envs"),
        ("env.control_mode=continuous", "the 'gymnasium' env type (env.env_type) does not read"),
        ("rollout.precision=bf16", "acts with the actor's own module"),
        ("actor.pack_sequences=true", "has no token sequences"),
    ],
)
def test_embodied_ppo_refuses_what_it_does_not_read(override: str, reason: str) -> None:
    (problem,) = refusals(CARTPOLE, override)
    assert problem.startswith(override.split("=")[0] + ": ")
    assert reason in problem


def test_embodied_ppo_refuses_a_loss_it_does_not_train_with() -> None:
    """Any registered policy loss trains (tests/shell/test_rlinf_plugins.py), but not one
    that needs a proximal policy, which embodied PPO keeps none of."""
    (problem,) = refusals(CARTPOLE, "algorithm.loss_type=decoupled_ppo")
    assert problem.startswith("algorithm.loss_type: 'decoupled_ppo' needs a proximal policy's")
    assert refusals(CARTPOLE, "algorithm.loss_type=gspo") == []


def test_embodied_grpo_refuses_the_critic_and_gae_settings() -> None:
    problems = refusals(CARTPOLE, "algorithm.adv_type=grpo", "algorithm.group_size=4")
    assert keys_of(problems) == ["algorithm.gamma", "algorithm.lam", "algorithm.vf_coef"]
    # With the return scaler on, γ is read (it discounts the scaler's returns).
    problems = refusals(
        CARTPOLE,
        "algorithm.adv_type=grpo",
        "algorithm.group_size=4",
        "algorithm.norm_reward=true",
    )
    assert keys_of(problems) == ["algorithm.lam", "algorithm.vf_coef"]


def test_sac_refuses_ppos_and_the_optimizer_settings_it_does_not_use() -> None:
    problems = refusals(
        PENDULUM,
        "actor.optim.clip_grad=0.5",
        "actor.optim.lr=3e-4",
        "algorithm.entropy_coef=0.01",
        "actor.fsdp_config.mixed_precision=bf16",
        "actor.backend=megatron",
    )
    assert keys_of(problems) == [  # in the schema's order
        "actor.optim.clip_grad",
        "actor.fsdp_config.mixed_precision",
        "actor.backend",
        "algorithm.entropy_coef",
    ]


def test_one_unsharded_actor_rank_refuses_the_wrap_policy() -> None:
    one_rank = 'cluster.component_placement={"actor": "0:0", "rollout": "0:0", "reward": "0"}'
    (problem,) = refusals(GRPO, one_rank)  # grpo.py's min_num_params
    assert problem.startswith("actor.fsdp_config.wrap_policy.min_num_params: one actor rank")
    # In another precision the one rank is sharded (cast) by FSDP: the policy is read.
    assert refusals(GRPO, one_rank, "actor.fsdp_config.mixed_precision=bf16") == []


def test_the_probe_refuses_nothing_a_training_config_sets() -> None:
    assert refusals(GRPO, "runner.runner_type=probe", "env.num_envs=4") == []


@pytest.mark.parametrize(
    "targets",
    ['["all-linear","q_proj"]', '["q_proj",""]', '[" q_proj"]'],
    ids=["mixed", "empty", "space"],
)
def test_lora_target_modules_are_suffixes_or_all_linear_alone(targets: str) -> None:
    problems = refusals(
        GRPO, "actor.model.is_lora=true", f"actor.model.lora_target_modules={targets}"
    )
    assert len(problems) == 1
    assert problems[0].startswith(
        "actor.model.lora_target_modules: expected module-name suffixes (e.g. ['q_proj', "
        "'v_proj']), or ['all-linear'] alone, got"
    )


def test_both_embodied_ppo_runners_take_a_flow_policy_acting_in_chunks() -> None:
    flow = "configs/ppo_flow_pushcube_cpu.py"
    assert refusals(flow, "actor.model.model_kwargs.action_chunk=5") == []
    pipelined = (
        "rollout.pipeline_stage_num=2",
        'cluster.component_placement={"actor": "0:0-1", "rollout": "0:0", "env": "0:0"}',
    )
    assert refusals(flow, "actor.model.model_kwargs.action_chunk=5", *pipelined) == []

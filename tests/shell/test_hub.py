"""Hub ids (`rlshell.hub`): models, tokenizers and datasets read through a Hub cache, offline.

The cache is built here the way huggingface_hub lays it out
(``models--org--name/refs/main`` naming a commit,
``snapshots/<commit>/<files>``), with a tiny Qwen2 model and the project's
tokenizer, and the arithmetic task written as GSM8K-style Parquet files.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlshell.config import ConfigError
from rlshell.data import ArithmeticTask, arithmetic_task, load_dataset
from rlshell.hub import hub_id, split_files
from rlshell.runners.validation import load_config
from tests.shell.test_run import ONE_ACTOR_RANK, ROOT, cli_env, train

GRPO = ROOT / "configs" / "grpo.py"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
TASK = ArithmeticTask(num_val=16)


def snapshot(cache: Path, kind: str, repo_id: str) -> Path:
    """An empty snapshot of ``repo_id`` in ``cache``, its ``refs/main`` pointing at it."""
    repo = cache / f"{kind}s--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    directory = repo / "snapshots" / COMMIT
    directory.mkdir(parents=True)
    return directory


def write_gsm8k_style(path: Path, split: str) -> None:
    """The arithmetic task's ``split`` as Parquet with GSM8K's columns and answer format."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    examples = arithmetic_task("train" if split == "train" else "val", TASK)
    table = pa.table(
        {
            "question": [e.prompt for e in examples],
            "answer": [f"Add them up.\n#### {e.answer}" for e in examples],
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hub cache holding the model testorg/tiny and the dataset testorg/arith."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from rlshell.tokenizer import build_char_tokenizer

    cache = tmp_path_factory.mktemp("hf") / "hub"
    model_dir = snapshot(cache, "model", "testorg/tiny")
    tokenizer = build_char_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    AutoModelForCausalLM.from_config(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    data_dir = snapshot(cache, "dataset", "testorg/arith")
    write_gsm8k_style(data_dir / "main" / "train-00000-of-00001.parquet", "train")
    write_gsm8k_style(data_dir / "main" / "test-00000-of-00001.parquet", "test")
    (data_dir / "README.md").write_text("an arithmetic task in GSM8K's layout\n")
    return cache


@pytest.fixture
def offline(hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process reads Hub ids from ``hub_cache`` only."""
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return hub_cache


# --- which values are Hub ids ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "kind", "expected"),
    [
        ("Qwen/Qwen2.5-0.5B-Instruct", "model", ("Qwen/Qwen2.5-0.5B-Instruct", "")),
        ("openai/gsm8k", "dataset", ("openai/gsm8k", "")),
        ("openai/gsm8k/main", "dataset", ("openai/gsm8k", "main")),
        ("openai/gsm8k/main", "model", None),  # a model is a whole repo
        ("gpt2", "model", None),  # no organisation: a local directory name
        ("/models/qwen", "model", None),
        ("./org/name", "model", None),
        ("~/org/name", "model", None),
        ("data/train.jsonl", "dataset", None),  # a data file's name: a local path
        ("data/train.parquet", "dataset", None),
        ("org--x/name", "model", None),  # not a valid repo id
        ("org/na..me", "model", None),
        ("-org/name", "model", None),
    ],
)
def test_hub_ids_and_local_paths_are_told_apart(value: str, kind: str, expected: object) -> None:
    assert hub_id(value, kind) == expected  # type: ignore[arg-type]


def test_an_existing_local_path_is_never_a_hub_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert hub_id("org/name") is None
    assert hub_id("org/other") == ("org/other", "")


# --- which files a split reads ---------------------------------------------------------------


def touch(directory: Path, *names: str) -> None:
    for name in names:
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text("")


def test_a_split_reads_every_shard_named_for_it_in_order(tmp_path: Path) -> None:
    touch(
        tmp_path,
        "data/train-00001-of-00002.parquet",
        "data/train-00000-of-00002.parquet",
        "data/test-00000-of-00001.parquet",
        "data/trainer_notes.jsonl",  # not "train" followed by - _ or .
        "README.md",
    )
    assert split_files("k", tmp_path, "train") == [
        tmp_path / "data/train-00000-of-00002.parquet",
        tmp_path / "data/train-00001-of-00002.parquet",
    ]
    assert split_files("k", tmp_path, "val") == [tmp_path / "data/test-00000-of-00001.parquet"]


def test_the_held_out_split_prefers_validation_to_test(tmp_path: Path) -> None:
    touch(tmp_path, "train.jsonl", "validation.jsonl", "test.jsonl")
    assert split_files("k", tmp_path, "val") == [tmp_path / "validation.jsonl"]


def test_a_split_in_several_folders_asks_for_the_folder(tmp_path: Path) -> None:
    touch(tmp_path, "main/train-0.parquet", "socratic/train-0.parquet")
    with pytest.raises(ValueError, match="several folders") as error:
        split_files("data.train_path", tmp_path, "train")
    assert str(error.value) == (
        f"data.train_path: {tmp_path} has train files in several folders (main, socratic); "
        "name one after the id, e.g. <org>/<name>/main"
    )


def test_a_missing_split_lists_the_data_files_there(tmp_path: Path) -> None:
    touch(tmp_path, "train.jsonl")
    with pytest.raises(FileNotFoundError) as error:
        split_files("data.val_path", tmp_path, "val")
    assert str(error.value) == (
        f"data.val_path: no 'validation' or 'test' .jsonl or .parquet file in {tmp_path} "
        "(data files there: train.jsonl)"
    )


# --- loading from the cache ------------------------------------------------------------------


def test_a_hub_dataset_loads_its_splits_from_the_cache(offline: Path) -> None:
    config = load_config(
        GRPO,
        [
            "data.task=file",
            "data.train_path=testorg/arith",
            "data.val_path=testorg/arith/main",
            "data.prompt_key=question",
        ],
        for_run=True,
    )
    train_set = load_dataset(config.data, "train")
    assert train_set == arithmetic_task("train", TASK)
    assert load_dataset(config.data, "val") == arithmetic_task("val", TASK)


def test_a_hub_model_and_its_tokenizer_load_from_the_cache(offline: Path) -> None:
    import torch

    from rlshell.models.hf_causal_lm import build_hf_causal_lm
    from rlshell.tokenizer import load_tokenizer

    config = load_config(GRPO, ["actor.model.path=testorg/tiny"], for_run=True)
    model = build_hf_causal_lm(config.actor.model, torch.float32)
    tokenizer = load_tokenizer("testorg/tiny")
    ids = tokenizer(["1+2+3="], return_tensors="pt")["input_ids"]
    assert model(ids).logits.shape == (1, 6, len(tokenizer))


# --- what is refused before start ------------------------------------------------------------


def test_ids_missing_from_the_cache_offline_are_named_exactly(offline: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(
            GRPO,
            [
                "actor.model.path=testorg/absent",
                "actor.model.tokenizer_path=testorg/tiny",
                "data.task=file",
                "data.train_path=testorg/nodata",
            ],
            for_run=True,
        )
    offline_note = "HF_HUB_OFFLINE is set, so nothing is downloaded: download it beforehand"
    assert caught.value.problems == [
        f"data.train_path: testorg/nodata is not a local path, and the Hugging Face dataset "
        f"testorg/nodata is not in the Hub cache {offline} (set by HF_HUB_CACHE or HF_HOME); "
        f"{offline_note} (`hf download testorg/nodata --repo-type dataset`) or unset "
        "HF_HUB_OFFLINE",
        f"actor.model.path: testorg/absent is not a local path, and the Hugging Face model "
        f"testorg/absent is not in the Hub cache {offline} (set by HF_HUB_CACHE or HF_HOME); "
        f"{offline_note} (`hf download testorg/absent`) or unset HF_HUB_OFFLINE",
    ]


def test_a_folder_the_dataset_lacks_is_named(offline: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(
            GRPO,
            ["data.task=file", "data.train_path=testorg/arith/socratic"],
            for_run=True,
        )
    snapshot = offline / "datasets--testorg--arith" / "snapshots" / COMMIT
    assert caught.value.problems == [
        f"data.train_path: the Hub dataset testorg/arith has no folder 'socratic' in its "
        f"snapshot {snapshot}"
    ]


def test_an_unreachable_hub_is_named(offline: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing answers
    with pytest.raises(ConfigError) as caught:
        load_config(GRPO, ["actor.model.path=testorg/absent"], for_run=True)
    (problem,) = caught.value.problems
    assert problem.startswith(
        f"actor.model.path: testorg/absent is not a local path, and the Hugging Face model "
        f"testorg/absent is not in the Hub cache {offline} (set by HF_HUB_CACHE or HF_HOME); "
        "the Hub is unreachable ("
    )


def test_a_missing_local_path_keeps_its_message(offline: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(GRPO, [f"actor.model.path={tmp_path / 'model'}"], for_run=True)
    assert caught.value.problems == [f"actor.model.path: {tmp_path / 'model'} does not exist"]


def test_a_model_builder_given_a_folder_without_a_model_names_its_key(tmp_path: Path) -> None:
    """Past validation (a model built directly, or a folder emptied since): the builders of
    `rlshell.models` refuse a directory with no config.json before transformers reads it."""
    import torch

    from rlshell.models.hf_causal_lm import build_hf_causal_lm, build_hf_value_model

    config = load_config(GRPO, [f"actor.model.path={tmp_path}"])
    for build, key in (
        (build_hf_causal_lm, "actor.model.path"),
        (build_hf_value_model, "critic.model_path (or actor.model.path)"),
    ):
        with pytest.raises(FileNotFoundError) as caught:
            build(config.actor.model, torch.float32)
        assert str(caught.value) == (
            f"{key}: {tmp_path} is not a Hugging Face model directory (no config.json there) "
            "nor a Hub id (org/name)"
        )


def test_dry_runs_do_not_look_in_the_cache(offline: Path) -> None:
    load_config(GRPO, ["actor.model.path=testorg/absent"], for_run=False)


def test_the_cli_stops_with_status_2_naming_the_missing_id(
    offline: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], ray_never_starts: None
) -> None:
    from rlshell.train import main

    status = main([str(GRPO), "actor.model.path=testorg/absent", f"runner.output_dir={tmp_path}"])
    assert status == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: {GRPO}: 1 problem in the config:",
        f"  - actor.model.path: testorg/absent is not a local path, and the Hugging Face model "
        f"testorg/absent is not in the Hub cache {offline} (set by HF_HUB_CACHE or HF_HOME); "
        "HF_HUB_OFFLINE is set, so nothing is downloaded: download it beforehand "
        "(`hf download testorg/absent`) or unset HF_HUB_OFFLINE",
    ]
    assert not (tmp_path / "grpo").exists()


# --- a real run --------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_run_trains_a_hub_model_on_a_hub_dataset_offline(
    hub_cache: Path, offline: Path, tmp_path: Path
) -> None:
    import tempfile

    # Ray's socket paths must stay short: its temp dir lives in /tmp.
    ray_tmp = Path(tempfile.mkdtemp(prefix="rh", dir="/tmp"))
    try:
        env = cli_env(ray_tmp, HF_HUB_CACHE=str(hub_cache), HF_HUB_OFFLINE="1")
        result = train(
            "configs/grpo.py",
            *ONE_ACTOR_RANK,
            "actor.model.path=testorg/tiny",
            "actor.model.model_kwargs={}",
            "data.task=file",
            "data.train_path=testorg/arith",
            "data.val_path=testorg/arith",
            "data.prompt_key=question",
            "runner.max_steps=2",
            "runner.prompts_per_step=4",
            "algorithm.group_size=4",
            "runner.eval_interval=2",
            "checkpoint.interval=2",
            "checkpoint.export_hf=false",
            f"runner.output_dir={tmp_path}",
            env=env,
            timeout=400,
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_dir = tmp_path / "grpo"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert all("reward/mean" in r for r in records[1:])
    assert [r["step"] for r in records if "eval/accuracy" in r] == [0, 2]
    checkpoint = run_dir / "checkpoints" / "global_step_2"
    assert (checkpoint / "tokenizer" / "tokenizer_config.json").is_file()
    from rlshell.export import load_policy

    policy = load_policy(checkpoint)  # built from testorg/tiny in the cache, as the run did
    assert policy.model.config.hidden_size == 32


def test_evaluate_scores_a_hub_model_on_a_hub_dataset(
    offline: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rlshell.evaluate import main

    status = main(
        [
            "testorg/tiny",
            "data.task=file",
            "data.train_path=testorg/arith",
            "data.val_path=testorg/arith",
            "data.prompt_key=question",
            "--config",
            str(GRPO),
            "--limit",
            "4",
            "--samples",
            "3",
        ]
    )
    assert status == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["eval/examples"] == 4
    # Greedy, and 3 samples a prompt: pass@3 and the per-sample accuracy, each with its 95%
    # interval around it (a tiny random model mostly scores 0: the bounds are still there).
    for key in ("eval/accuracy", "eval/pass@3", "eval/sample_accuracy"):
        assert 0.0 <= report.get(f"{key}_low", 0.0) <= report[key] <= report[f"{key}_high"] <= 1
    assert report["eval/samples_per_prompt"] == 3
    assert report["eval/pass@3"] >= report["eval/sample_accuracy"]

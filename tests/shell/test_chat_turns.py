"""Conversations in a pretrained model's own chat template (`rlshell.conversation.ChatTurns`).

With SmolLM2-135M-Instruct's tokenizer and its ChatML template (``make install``):

- `render_conversation` with the template, on hypothesis-drawn conversations: its text is
  the template's rendering of the conversation (up to the last assistant's EOS), its
  trained tokens are each assistant message's tokens and the EOS after it, nothing else;
- the multi-turn loop in the template: a turn that ends (EOS) with the closing marker is a
  call, whatever the marker's token count; the observation is the template's tool turn and
  the next assistant header; a trajectory is token for token its conversation's rendering;
- templates that cannot be cut turn by turn, and the keys a chat run does not read, are
  refused with the reason.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from attrs import evolve
from hypothesis import given, settings
from hypothesis import strategies as st

from rlshell.config import AgentConfig, ConfigError
from rlshell.conversation import ChatTurns, Message, render_conversation
from rlshell.engines.rollout.multi_turn import AgentLoop, agent_metrics
from rlshell.gguf import SMOLLM2, verify
from rlshell.hub import from_pretrained
from rlshell.rollout import SamplingParams
from rlshell.runners.validation import load_config, validate
from tests.shell.test_multi_turn import ScriptedEngine

ROOT = Path(__file__).resolve().parents[2]


def _tokenizer() -> object:
    from transformers import AutoTokenizer

    verify(SMOLLM2.repo_id, hashes=False)  # make install
    return from_pretrained(AutoTokenizer, SMOLLM2.repo_id)


TOKENIZER = _tokenizer()
CHAT = ChatTurns(TOKENIZER)
EOS = int(TOKENIZER.eos_token_id)  # type: ignore[attr-defined]


def encode(text: str) -> list[int]:
    return list(TOKENIZER.encode(text, add_special_tokens=False))  # type: ignore[attr-defined]


def template_text(messages: Sequence[Message]) -> str:
    return str(
        TOKENIZER.apply_chat_template(  # type: ignore[attr-defined]
            [{"role": m.role, "content": m.content} for m in messages], tokenize=False
        )
    )


texts = st.text(st.sampled_from("abcxyz0123456789 +*=?.<>/"), min_size=1, max_size=12)
messages = st.builds(Message, st.sampled_from(["system", "user", "assistant", "tool"]), texts)
conversations = st.tuples(
    st.builds(Message, st.just("user"), texts),
    st.lists(messages, max_size=5),
    st.builds(Message, st.just("assistant"), texts),
).map(lambda parts: [parts[0], *parts[1], parts[2]])


@settings(max_examples=40, deadline=None)
@given(conversations)
def test_the_rendering_is_the_templates_text_with_the_assistants_turns_trained(
    conversation: list[Message],
) -> None:
    rendered = render_conversation(conversation, TOKENIZER, "<result>", "</result>", CHAT)
    decoded = TOKENIZER.decode(rendered.ids.tolist())  # type: ignore[attr-defined]
    # Up to the last assistant's EOS: the template's own rendering, less what follows it.
    assert decoded + CHAT.turn_end == template_text(conversation)
    turns = [m.content for m in conversation if m.role == "assistant"]
    assert rendered.ids[rendered.trained].tolist() == [
        token for turn in turns for token in [*encode(turn), EOS]
    ]
    assert not bool(rendered.trained[0])


def test_a_tool_turn_is_the_templates_and_messages_after_the_last_answer_are_left_out() -> None:
    conversation = [
        Message("user", "What is 6*7?"),
        Message("assistant", "<call>6*7</call>"),
        Message("tool", "42"),
        Message("assistant", "42"),
        Message("user", "thanks"),  # trains nothing
    ]
    rendered = render_conversation(conversation, TOKENIZER, "<result>", "</result>", CHAT)
    text = TOKENIZER.decode(rendered.ids.tolist())  # type: ignore[attr-defined]
    assert text.endswith(
        "<|im_start|>assistant\n<call>6*7</call><|im_end|>\n<|im_start|>tool\n42<|im_end|>\n"
        "<|im_start|>assistant\n42<|im_end|>"
    )
    assert "<result>" not in text


def test_templates_that_cannot_be_cut_turn_by_turn_are_refused() -> None:
    from transformers import AutoTokenizer

    tokenizer = from_pretrained(AutoTokenizer, SMOLLM2.repo_id)
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="has no chat template"):
        ChatTurns(tokenizer)
    # An assistant turn closed by something else than the EOS the model stops on.
    tokenizer.chat_template = "{% for m in messages %}[{{ m.role }}]{{ m.content }}|{% endfor %}"
    with pytest.raises(ValueError, match=re.escape("not the EOS token '<|im_end|>'")):
        ChatTurns(tokenizer)
    # The last message rendered apart from the others: an earlier turn changes later.
    tokenizer.chat_template = (
        "{% for m in messages %}{% if loop.last %}LAST:{% endif %}{{ m.content }}<|im_end|>"
        "{% endfor %}{% if add_generation_prompt %}A:{% endif %}"
    )
    with pytest.raises(ValueError, match="renders an earlier turn differently"):
        ChatTurns(tokenizer)
    # A template without a tool role (Llama 2's kind): plain conversations still render, a
    # tool turn is refused naming the turns.
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools') }}"
        "{% endif %}<{{ m.role }}>{{ m.content }}<|im_end|>{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    chat = ChatTurns(tokenizer)
    with pytest.raises(ValueError, match=r"cannot render the turns .*'tool'.*no tools"):
        chat.between([Message("tool", "42")])


# ----------------------------------------------------------------------------- the agent loop


def turns_ended(trajectory: list[int]) -> int:
    """How many of the model's turns a trajectory (the context after the prompt) holds: in
    ChatML each ended turn and the tool's turn after it end with the EOS token."""
    return trajectory.count(EOS) // 2


def chat_engine(scripts: dict[str, list[tuple[str, bool]]]) -> ScriptedEngine:
    """tests/shell/test_multi_turn.py's scripted engine, in SmolLM2's tokenizer and turns."""
    return ScriptedEngine(scripts, TOKENIZER, turns_ended)


# A closing marker of several tokens in this tokenizer: a chat turn ends at its EOS.
AGENT = AgentConfig(
    tools=("calculator",), default_tool="calculator", max_turns=3, max_total_tokens=512
)


@pytest.fixture(scope="module")
def loop() -> Iterator[AgentLoop]:
    agent_loop = AgentLoop(TOKENIZER, AGENT, max_new_tokens=40, chat=CHAT)
    yield agent_loop
    agent_loop.close()


def test_a_chat_trajectory_is_its_conversation_rendered_in_the_template(loop: AgentLoop) -> None:
    assert len(encode(AGENT.call_end)) > 1
    question = [Message("user", "What is 347*829?")]
    prompt = CHAT.opening(question)
    script = [
        ("Let me compute. <call>347*829</call>", True),  # a call: the turn ended on it
        ("It is 287663.", True),
    ]
    engine = chat_engine({prompt: script})
    batch = loop.generate(engine, [prompt], SamplingParams(n=2, max_new_tokens=40), seed=0)

    conversation = [
        *question,
        Message("assistant", script[0][0]),
        Message("tool", "287663"),
        Message("assistant", script[1][0]),
    ]
    rendered = render_conversation(conversation, TOKENIZER, "", "", CHAT)
    skip = len(encode(prompt))
    for row in range(2):
        valid = batch.response_mask[row]
        assert batch.response_ids[row][valid].tolist() == rendered.ids[skip:].tolist()
        assert batch.trained_mask[row][valid].tolist() == rendered.trained[skip:].tolist()
    assert batch.response_texts == ("It is 287663.", "It is 287663.")
    metrics = agent_metrics(batch)
    assert (metrics["tools/ok"], metrics["agent/turns_mean"]) == (2.0, 2.0)
    # No stop token added for the marker: the turn is the model's until its EOS.
    assert all(params.stop_token_ids == () for _, params in engine.requests)


def test_a_marker_not_at_the_end_of_the_turn_or_a_turn_cut_short_is_no_call(
    loop: AgentLoop,
) -> None:
    prompts = [CHAT.opening([Message("user", f"q{i}")]) for i in range(2)]
    engine = chat_engine(
        {
            prompts[0]: [("<call>1+1</call> is what I would ask.", True)],
            prompts[1]: [("<call>1+1</call>", False)],  # cut by the token budget, no EOS
        }
    )
    batch = loop.generate(engine, prompts, SamplingParams(n=1, max_new_tokens=40))
    assert batch.row_stats["tool_calls"].tolist() == [0.0, 0.0]
    assert batch.row_stats["turns"].tolist() == [1.0, 1.0]


def test_a_chat_run_refuses_result_markers_it_would_not_read_and_a_model_built_here() -> None:
    smollm2 = [f"actor.model.path={SMOLLM2.repo_id}", "actor.model.model_kwargs={}"]
    sft = load_config(ROOT / "configs" / "sft_tool_calls.py", [*smollm2, "data.chat_template=true"])
    assert validate(sft) == []
    marked = evolve(sft, agent=evolve(sft.agent, result_start="<r>"))
    assert any(p.startswith("agent.result_start") for p in validate(marked))
    with pytest.raises(ConfigError, match=r"data\.chat_template: the model is built here"):
        load_config(ROOT / "configs" / "sft_tool_calls.py", ["data.chat_template=true"])

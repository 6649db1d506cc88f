"""The multi-turn loop (`rlshell.engines.rollout.multi_turn`): trajectories, masks, tools.

A scripted engine plays the model: each row follows a script of turns drawn
by hypothesis (tool calls, malformed calls, answers), so the loop's
bookkeeping is checked against the conversation the script describes:
the trajectory's tokens are `render_conversation`'s, token for token, the
trained mask is exactly the model's turns, the behaviour log-probs sit on
the tokens that were sampled, and every way a trajectory ends is counted.
The tools are the real sandbox's (`rlshell.tools.sandbox.ToolExecutor`).
A last test runs the loop on the real HF engine and checks that the actor's
recompute of the trajectory gives the engine's log-probs on the trained tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from attrs import evolve
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlshell.config import AgentConfig
from rlshell.conversation import Message, render_conversation
from rlshell.engines.rollout.hf import HFRolloutEngine
from rlshell.engines.rollout.multi_turn import AgentLoop, agent_metrics, call_format
from rlshell.models import get_model
from rlshell.rollout import RolloutBatch, SamplingParams
from rlshell.runners.validation import load_config
from rlshell.tokenizer import build_char_tokenizer, with_tokenizer_ids
from rlshell.tools.parsing import ParseError, ToolCall, parse_tool_call
from rlshell.workers.forward import policy_forward

MARKERS = ("<call>", "</call>", "<result>", "</result>")


def make_tokenizer() -> object:
    tokenizer = build_char_tokenizer("0123456789+*= abcdefghijklmnopqrstuvwxyz")
    tokenizer.add_tokens(list(MARKERS))
    return tokenizer


TOKENIZER = make_tokenizer()
EOS = int(TOKENIZER.eos_token_id)  # type: ignore[attr-defined]
PAD = int(TOKENIZER.pad_token_id)  # type: ignore[attr-defined]


def encode(text: str) -> list[int]:
    return list(TOKENIZER.encode(text, add_special_tokens=False))  # type: ignore[attr-defined]


# A turn of a script: the text the model writes and whether it ends with EOS (an answer).
Turn = tuple[str, bool]


def observations_seen(trajectory: list[int]) -> int:
    """How many observations a trajectory (the context after the prompt) holds."""
    return trajectory.count(encode("</result>")[0])


class ScriptedEngine:
    """Plays row r's script: its k-th turn once the context holds k − 1 observations
    (``turn_of``: the turn a context is at, from its tokens after the prompt), in
    ``tokenizer`` (the character one here).

    Rows are told apart by their prompt; each token's log-prob is a distinct
    value (−(position + 1) / 100 − turn), so the test can find where it went.
    """

    def __init__(
        self,
        scripts: dict[str, list[Turn]],
        tokenizer: Any = TOKENIZER,
        turn_of: Callable[[list[int]], int] = observations_seen,
    ) -> None:
        self.scripts = scripts
        self.tokenizer, self.turn_of = tokenizer, turn_of
        self.eos, self.pad = int(tokenizer.eos_token_id), int(tokenizer.pad_token_id)
        self.requests: list[tuple[int, SamplingParams]] = []

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _turn(self, context: list[int]) -> tuple[list[int], list[float]]:
        for prompt, script in self.scripts.items():
            start = self._encode(prompt)
            if context[: len(start)] == start:
                turn = self.turn_of(context[len(start) :])
                text, answer = script[turn]
                tokens = self._encode(text) + ([self.eos] if answer else [])
                return tokens, [-(i + 1) / 100 - turn for i in range(len(tokens))]
        raise AssertionError(f"no script for context {context}")

    def _batch(self, contexts: list[list[int]], params: SamplingParams) -> RolloutBatch:
        self.requests.append((len(contexts), params))
        turns = [self._turn(context) for context in contexts]
        stops = set(params.end_ids(self.eos))
        rows = []
        for tokens, logprobs in turns:  # an engine stops at the first end token, or the budget
            cut = next((i + 1 for i, t in enumerate(tokens) if t in stops), len(tokens))
            cut = min(cut, params.max_new_tokens)
            rows.append((tokens[:cut], logprobs[:cut]))
        width = max(len(t) for t, _ in rows)
        prompt_width = max(len(c) for c in contexts)
        ids = torch.full((len(rows), width), self.pad)
        mask = torch.zeros((len(rows), width), dtype=torch.bool)
        lps = torch.zeros((len(rows), width))
        prompt_ids = torch.full((len(rows), prompt_width), self.pad)
        prompt_mask = torch.zeros((len(rows), prompt_width), dtype=torch.bool)
        for i, ((tokens, logprobs), context) in enumerate(zip(rows, contexts, strict=True)):
            ids[i, : len(tokens)] = torch.tensor(tokens)
            mask[i, : len(tokens)] = True
            lps[i, : len(tokens)] = torch.tensor(logprobs)
            prompt_ids[i, prompt_width - len(context) :] = torch.tensor(context)
            prompt_mask[i, prompt_width - len(context) :] = True
        return RolloutBatch(
            prompt_ids, prompt_mask, ids, mask, lps, tuple("" for _ in rows), group_size=params.n
        )

    def generate(
        self, prompts: Sequence[str], params: SamplingParams, seed: int | None = None
    ) -> RolloutBatch:
        return self._batch([self._encode(p) for p in prompts for _ in range(params.n)], params)

    def generate_from_ids(
        self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams, seed: int | None = None
    ) -> RolloutBatch:
        return self._batch([list(p) for p in prompt_ids], params)


# A budget that never cuts a script (parse errors' observations are long).
AGENT = AgentConfig(
    tools=("calculator",), default_tool="calculator", max_turns=3, max_total_tokens=1024
)


@pytest.fixture(scope="module")
def loop() -> Iterator[AgentLoop]:
    agent_loop = AgentLoop(TOKENIZER, AGENT, max_new_tokens=24)
    yield agent_loop
    agent_loop.close()


def calculator(expression: str) -> str:
    return str(eval(expression))  # the test's own oracle for the calculator's answers


# One turn of a script: a well-formed call, a malformed one, or an answer.
expressions = st.builds(
    lambda a, op, b: f"{a}{op}{b}", st.integers(0, 999), st.sampled_from("+*"), st.integers(0, 99)
)
call_turns = expressions.map(lambda e: (f"<call>{e}</call>", False))
malformed_turns = st.sampled_from([("<call></call>", False), ("12</call>", False)])
answer_turns = st.integers(0, 10**6).map(lambda v: (str(v), True))
scripts = st.lists(st.one_of(call_turns, malformed_turns), max_size=3).flatmap(
    lambda calls: answer_turns.map(lambda answer: [*calls, answer])
)


FORMAT = call_format(AGENT)


def observation_of(turn_text: str) -> str:
    """What the loop shows after a turn: the oracle's answer to a call, or the parse error."""
    parsed = parse_tool_call(turn_text, FORMAT)
    if isinstance(parsed, ToolCall):
        return calculator(parsed.argument)
    assert isinstance(parsed, ParseError)
    return f"error: {parsed.message}"


def conversation_of(prompt: str, script: list[Turn], cap: int) -> tuple[list[Message], bool]:
    """The conversation a script makes within ``cap`` turns, and whether it ends answered."""
    messages = [Message("user", prompt)]
    for index, (text, answer) in enumerate(script[:cap]):
        messages.append(Message("assistant", text))
        if answer:
            return messages, True
        if index == cap - 1:
            return messages, False  # a call in the last turn is not run
        messages.append(Message("tool", observation_of(text)))
    raise AssertionError("a script ends with an answer")


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(scripts, min_size=1, max_size=4))
def test_trajectories_are_the_rendered_conversations_with_the_models_turns_trained(
    loop: AgentLoop, row_scripts: list[list[Turn]]
) -> None:
    prompts = [f"{i}*{i}=" for i in range(len(row_scripts))]
    engine = ScriptedEngine(dict(zip(prompts, row_scripts, strict=True)))
    batch = loop.generate(engine, prompts, SamplingParams(n=1, max_new_tokens=24), seed=3)

    assert batch.rows == len(prompts)
    for row, (prompt, script) in enumerate(zip(prompts, row_scripts, strict=True)):
        messages, answered = conversation_of(prompt, script, AGENT.max_turns)
        rendered = render_conversation(messages, TOKENIZER, "<result>", "</result>")
        skip = len(encode(prompt))
        # render_conversation ends the last assistant message with EOS; a capped call has none.
        stop = None if answered else -1
        valid = batch.response_mask[row]
        trained = batch.trained_mask[row][valid]
        assert batch.response_ids[row][valid].tolist() == rendered.ids[skip:stop].tolist()
        assert trained.tolist() == rendered.trained[skip:stop].tolist()
        # Behaviour log-probs on the sampled tokens, 0 on the observations.
        logprobs = batch.logprobs[row][valid]
        assert bool((logprobs[~trained] == 0).all())
        assert bool((logprobs[trained] < 0).all())
        turns = sum(1 for m in messages if m.role == "assistant")
        assert batch.row_stats["turns"][row] == turns
        assert batch.row_stats["tool_calls"][row] == sum(1 for m in messages if m.role == "tool")
        assert batch.response_texts[row] == messages[-1].content
        assert batch.row_stats["ended_answer"][row] == float(answered)
        assert batch.row_stats["ended_turn_cap"][row] == float(not answered)
    metrics = agent_metrics(batch)
    assert metrics["tools/calls"] == float(batch.row_stats["tool_calls"].sum())
    assert metrics["tools/ok"] + metrics["tools/parse_error"] == metrics["tools/calls"]


def test_a_call_runs_in_the_sandbox_and_its_answer_is_the_observation(loop: AgentLoop) -> None:
    engine = ScriptedEngine({"347*829=": [("<call>347*829</call>", False), ("287663", True)]})
    batch = loop.generate(engine, ["347*829="], SamplingParams(n=2, max_new_tokens=24), seed=0)
    assert (batch.rows, batch.group_size) == (2, 2)
    text = TOKENIZER.decode(batch.response_ids[0][batch.response_mask[0]])  # type: ignore[attr-defined]
    assert text == "<call>347*829</call><result>287663</result>287663<eos>"
    assert batch.response_texts == ("287663", "287663")
    assert agent_metrics(batch)["tools/ok"] == 2.0
    # Later turns are n=1 requests on token ids, the call's closing marker a stop token.
    (first_rows, first), (later_rows, later) = engine.requests
    assert (first_rows, first.n, later_rows, later.n) == (2, 2, 2, 1)
    assert encode("</call>")[0] in later.stop_token_ids


def test_the_token_budget_cuts_a_trajectory_and_says_so() -> None:
    agent = evolve(AGENT, max_total_tokens=12)
    loop = AgentLoop(TOKENIZER, agent, max_new_tokens=24)
    try:
        engine = ScriptedEngine({"1*1=": [("<call>999*99</call>", False), ("98901", True)]})
        batch = loop.generate(engine, ["1*1="], SamplingParams(n=1, max_new_tokens=24))
    finally:
        loop.close()
    assert int(batch.response_mask.sum()) == 12  # 9 of the call, 3 of its observation
    assert batch.row_stats["ended_token_budget"][0] == 1.0
    assert batch.row_stats["turns"][0] == 1.0


def test_a_failed_call_is_rewarded_on_the_turn_that_made_it() -> None:
    agent = evolve(AGENT, tool_error_reward=-0.5)
    loop = AgentLoop(TOKENIZER, agent, max_new_tokens=24)
    try:
        script = [("<call>1+</call>", False), ("<call>2*3</call>", False), ("6", True)]
        batch = loop.generate(ScriptedEngine({"2*3=": script}), ["2*3="], SamplingParams())
    finally:
        loop.close()
    assert batch.token_rewards is not None
    rewarded = batch.token_rewards[0].nonzero().flatten().tolist()
    assert rewarded == [len(encode("<call>1+</call>")) - 1]  # the first call's closing token
    assert batch.token_rewards[0, rewarded[0]] == -0.5
    assert agent_metrics(batch)["tools/error"] == 1.0


def test_a_closing_marker_that_is_several_tokens_is_refused() -> None:
    with pytest.raises(ValueError, match=r"agent.call_end: '</calc>' is 7 tokens"):
        AgentLoop(TOKENIZER, evolve(AGENT, call_end="</calc>"), max_new_tokens=8)


def test_on_the_hf_engine_the_actors_recompute_gives_the_behaviour_logprobs(
    tmp_path: Path,
) -> None:
    """Tokens in, tokens out: a trajectory sampled turn by turn by the real engine, observations
    between, is what the actor's forward scores: its log-probs on the trained tokens are the
    engine's (pack and padded forwards alike)."""
    base = load_config(Path("configs/grpo.py"), ["rollout.max_new_tokens=6"])
    tokenizer_dir = tmp_path / "tokenizer"
    TOKENIZER.save_pretrained(tokenizer_dir)  # type: ignore[attr-defined]
    config = with_tokenizer_ids(base, tokenizer_dir)
    torch.manual_seed(0)
    engine = HFRolloutEngine(get_model(config.actor.model), TOKENIZER, torch.device("cpu"))
    # The closing marker made likely, so that random weights call tools often.
    call_end = encode("</call>")[0]
    with torch.no_grad():
        engine.model.lm_head.bias = None
        engine.model.lm_head.weight[call_end] *= 4.0
    loop = AgentLoop(TOKENIZER, AGENT, max_new_tokens=6)
    try:
        params = SamplingParams(n=4, temperature=0.9, max_new_tokens=6)
        batch = loop.generate(engine, ["12*3=", "7+5="], params, seed=11)
    finally:
        loop.close()
    assert float(batch.row_stats["turns"].max()) >= 2, "no trajectory had a second turn"
    trained = batch.trained_mask
    assert bool((trained <= batch.response_mask).all())
    assert not bool(trained.equal(batch.response_mask)), "no observation in the batch"
    for pack in (False, True):
        logprobs, _ = policy_forward(engine.model, batch, 0.9, chunk_size=None, pack=pack)
        torch.testing.assert_close(logprobs[trained], batch.logprobs[trained], atol=1e-5, rtol=0)

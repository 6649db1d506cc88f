"""Multi-turn, tool-using rollouts over any rollout engine (``agent.tools``).

    loop = AgentLoop(tokenizer, config.agent, config.rollout.max_new_tokens)
    batch = loop.generate(engine, prompts, params, seed)   # a RolloutBatch, as engine.generate's
    loop.close()                                            # the tool sandbox's processes

One response is a whole trajectory: the model writes a turn; a turn that
ends with a tool call's closing marker (``agent.call_end``, a stop token of
the engine) has the call parsed (`rlshell.tools.parsing`) and run in the
sandbox (`rlshell.tools.sandbox`); the tool's output, wrapped in the result
markers, is appended as an observation, and the model writes its next turn
from there. A trajectory ends at a turn without a call (its answer), after
``agent.max_turns`` model turns (a call in the last one is not run), or at
``agent.max_total_tokens`` response tokens.

Tokens in, tokens out: the first turn is the engine's ``generate`` on the
prompt text; every later turn is ``generate_from_ids`` on the prompt's and
the trajectory's token ids, never decoded and re-encoded, so the actor
trains on exactly the tokens that were sampled, with their behaviour
log-probs. An observation is encoded on its own, as
`rlshell.conversation.render_conversation` encodes a tool message, so a
trajectory is token for token the rendering of its conversation: what the
SFT stage teaches is what the rollout sees.

A chat model (``data.chat_template``, `rlshell.conversation.ChatTurns`) writes whole
turns in its own template: a turn ends at its EOS token, and one whose text ends with the
closing marker is a call; the observation is the template's text from there to the next
assistant turn (the tool's turn, the next header), as `render_conversation` renders a
conversation in that template. The closing marker need not be one token then.

The batch's ``response_mask`` covers the whole trajectory (the model reads
its observations); ``loss_mask`` only the model's tokens; ``token_rewards``
carries ``agent.tool_error_reward`` on the last token of each turn whose call
failed; ``row_stats`` counts turns and calls by outcome for the ``agent/``
and ``tools/`` metrics (`agent_metrics`). The reward reads the final turn's
text (``response_texts``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import torch
from attrs import evolve
from torch import Tensor

from rlshell.conversation import ChatTurns, Message, tool_message_text
from rlshell.rollout import RolloutBatch, SamplingParams
from rlshell.tools.parsing import ParseError, ToolCall, ToolCallFormat, parse_tool_call
from rlshell.tools.sandbox import STATUSES, ToolExecutor, ToolLimits, ToolResult

if TYPE_CHECKING:
    from rlshell.config import AgentConfig, Config

__all__ = [
    "AgentLoop",
    "TokenEngine",
    "agent_metrics",
    "call_format",
    "check_turns",
    "make_agent_loop",
    "sample",
    "single_token_id",
]


# row_stats keys: model turns, tool calls, tool tokens, calls by outcome, how trajectories ended.
ROW_STATS = (
    "turns",
    "tool_calls",
    "tool_tokens",
    *(f"tool_{status}" for status in STATUSES),
    "ended_answer",
    "ended_turn_cap",
    "ended_token_budget",
)
FAILED = frozenset(STATUSES) - {"ok"}


class TokenEngine(Protocol):
    """What the loop needs of a rollout engine (`rlshell.engines.rollout.RolloutEngine`)."""

    def generate(
        self, prompts: Sequence[str], params: SamplingParams, seed: int | None = None
    ) -> RolloutBatch: ...

    def generate_from_ids(
        self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams, seed: int | None = None
    ) -> RolloutBatch: ...


def call_format(agent: AgentConfig, chat: bool = False) -> ToolCallFormat:
    """The tool-call format ``agent.*`` configures (``chat``: the turns are a chat template's,
    whose tool turn holds a result: the result markers are not read)."""
    results = {} if chat else {"result_start": agent.result_start, "result_end": agent.result_end}
    return ToolCallFormat(
        call_start=agent.call_start,
        call_end=agent.call_end,
        body=agent.call_body,
        default_tool=agent.default_tool,
        tools=tuple(agent.tools),
        **results,
    )


def single_token_id(tokenizer: object, text: str, key: str) -> int:
    """The id of the one token ``text`` encodes to; a clear error when it is several."""
    ids = list(tokenizer.encode(text, add_special_tokens=False))  # type: ignore[attr-defined]
    if len(ids) != 1:
        raise ValueError(
            f"{key}: {text!r} is {len(ids)} tokens in this tokenizer; a turn stops on it, so it "
            "must be one token (the project's character tokenizer adds the agent markers as "
            "tokens; a Hugging Face tokenizer needs it in its vocabulary, e.g. Qwen2.5's "
            "'</tool_call>')"
        )
    return int(ids[0])


class _Trajectory:
    """One row's growing response: tokens, behaviour log-probs, trained flags, turn rewards."""

    def __init__(self, context: list[int]) -> None:
        self.context = context
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.trained: list[bool] = []
        self.rewards: dict[int, float] = {}  # token position -> per-turn reward
        self.stats = dict.fromkeys(ROW_STATS, 0.0)
        self.final_text = ""

    def add_turn(self, tokens: list[int], logprobs: list[float]) -> None:
        self.tokens += tokens
        self.logprobs += logprobs
        self.trained += [True] * len(tokens)
        self.stats["turns"] += 1

    def add_observation(self, tokens: list[int]) -> None:
        self.tokens += tokens
        self.logprobs += [0.0] * len(tokens)
        self.trained += [False] * len(tokens)
        self.stats["tool_tokens"] += len(tokens)


class AgentLoop:
    """Runs multi-turn trajectories on an engine, calling tools between turns.

    The tool sandbox (``agent.num_tool_processes`` processes) starts with the
    loop and lives until `close`.
    """

    def __init__(
        self,
        tokenizer: object,
        agent: AgentConfig,
        max_new_tokens: int,
        chat: ChatTurns | None = None,
    ) -> None:
        if not agent.tools:
            raise ValueError("AgentLoop: agent.tools is empty; a rollout without tools is one turn")
        self.tokenizer = tokenizer
        self.agent = agent
        self.format = call_format(agent, chat=chat is not None)
        self.chat = chat
        # A chat model's turn ends at its EOS; a plain-text one's also at the closing marker.
        self.call_end_id = (
            None if chat else single_token_id(tokenizer, agent.call_end, "agent.call_end")
        )
        self.max_new_tokens = max_new_tokens
        self.budget = agent.max_total_tokens or agent.max_turns * max_new_tokens
        self.eos_id = int(tokenizer.eos_token_id)  # type: ignore[attr-defined]
        self.executor = ToolExecutor(
            agent.tools,
            ToolLimits(
                timeout_s=agent.tool_timeout_s,
                memory_mb=agent.tool_memory_mb,
                max_output_chars=agent.tool_max_output_chars,
                network=agent.tool_network,
                max_processes=agent.tool_max_processes,
                isolation=agent.tool_isolation,
            ),
            num_processes=agent.num_tool_processes,
        )

    def close(self) -> None:
        self.executor.close()

    def generate(
        self,
        engine: TokenEngine,
        prompts: Sequence[str],
        params: SamplingParams,
        seed: int | None = None,
    ) -> RolloutBatch:
        """``params.n`` trajectories per prompt, grouped as `RolloutBatch` rows are."""
        stops = () if self.call_end_id is None else (self.call_end_id,)
        turn_params = evolve(
            params,
            stop_token_ids=(*params.stop_token_ids, *stops),
            max_new_tokens=min(params.max_new_tokens, self.budget),
        )
        first = engine.generate(prompts, turn_params, seed=seed)
        trajectories = [
            _Trajectory(first.prompt_ids[row][first.prompt_mask[row]].tolist())
            for row in range(first.rows)
        ]
        active = list(range(first.rows))
        turn_batch = first
        turn = 1
        while True:
            calls = self._absorb_turn(trajectories, active, turn_batch, turn)
            active = self._run_calls(trajectories, calls)
            if not active:
                break
            turn += 1
            later = evolve(turn_params, n=1, min_new_tokens=0)
            turn_batch = engine.generate_from_ids(
                [trajectories[row].context + trajectories[row].tokens for row in active],
                later,
                seed=None if seed is None else _turn_seed(seed, turn),
            )
        return self._batch(first, trajectories)

    def _absorb_turn(
        self, trajectories: list[_Trajectory], active: list[int], batch: RolloutBatch, turn: int
    ) -> list[tuple[int, ToolCall | ParseError]]:
        """Append each active row's new turn; return the calls to run (row, parsed call)."""
        calls: list[tuple[int, ToolCall | ParseError]] = []
        for index, row in enumerate(active):
            trajectory = trajectories[row]
            valid = batch.response_mask[index]
            tokens = batch.response_ids[index][valid].tolist()
            logprobs = batch.logprobs[index][valid].tolist()
            room = self.budget - len(trajectory.tokens)
            tokens, logprobs = tokens[:room], logprobs[:room]
            trajectory.add_turn(tokens, logprobs)
            text = self.tokenizer.decode(  # type: ignore[attr-defined]
                [t for t in tokens if t != self.eos_id], skip_special_tokens=True
            )
            trajectory.final_text = text
            called = self._called(tokens, text)
            if not called:
                ended = "ended_answer" if tokens and tokens[-1] == self.eos_id else None
                if ended is None:
                    # Cut by a budget: the turn's, or the trajectory's.
                    ended = (
                        "ended_token_budget"
                        if len(trajectory.tokens) >= self.budget
                        else "ended_answer"
                    )
                trajectory.stats[ended] = 1.0
                continue
            if turn >= self.agent.max_turns:
                trajectory.stats["ended_turn_cap"] = 1.0
                continue
            parsed = parse_tool_call(text, self.format)
            if parsed is None:  # the closing marker with no opening one
                parsed = ParseError(
                    f"no {self.format.call_start!r} before {self.format.call_end!r}", text
                )
            calls.append((row, parsed))
        return calls

    def _called(self, tokens: list[int], text: str) -> bool:
        """Whether a turn ends with a call: the closing marker (a chat model's: its turn's
        text ends with it, and the turn ended)."""
        if not tokens:
            return False
        if self.chat is None:
            return tokens[-1] == self.call_end_id
        return tokens[-1] == self.eos_id and text.rstrip().endswith(self.format.call_end)

    def _run_calls(
        self, trajectories: list[_Trajectory], calls: list[tuple[int, ToolCall | ParseError]]
    ) -> list[int]:
        """Run the calls, append their observations; the rows that go on to another turn."""
        results = self.executor.run([call for _, call in calls]) if calls else []
        going_on = []
        for (row, _), result in zip(calls, results, strict=True):
            trajectory = trajectories[row]
            trajectory.stats["tool_calls"] += 1
            trajectory.stats[f"tool_{result.status}"] += 1
            if result.status in FAILED and self.agent.tool_error_reward:
                last = len(trajectory.tokens) - 1  # the call's closing token
                trajectory.rewards[last] = (
                    trajectory.rewards.get(last, 0.0) + self.agent.tool_error_reward
                )
            observation = self._observation_ids(result)
            room = self.budget - len(trajectory.tokens)
            trajectory.add_observation(observation[:room])
            if len(trajectory.tokens) >= self.budget:
                trajectory.stats["ended_token_budget"] = 1.0
            else:
                going_on.append(row)
        return going_on

    def _observation_ids(self, result: ToolResult) -> list[int]:
        if self.chat is not None:
            text = self.chat.between([Message("tool", result.observation)])
        else:
            text = tool_message_text(
                result.observation, self.format.result_start, self.format.result_end
            )
        return list(self.tokenizer.encode(text, add_special_tokens=False))  # type: ignore[attr-defined]

    def _batch(self, first: RolloutBatch, trajectories: list[_Trajectory]) -> RolloutBatch:
        rows, width = len(trajectories), max(1, max(len(t.tokens) for t in trajectories))
        pad = int(self.tokenizer.pad_token_id)  # type: ignore[attr-defined]
        ids = torch.full((rows, width), pad, dtype=torch.long)
        valid = torch.zeros((rows, width), dtype=torch.bool)
        trained = torch.zeros((rows, width), dtype=torch.bool)
        logprobs = torch.zeros((rows, width))
        rewards = torch.zeros((rows, width))
        for row, trajectory in enumerate(trajectories):
            length = len(trajectory.tokens)
            ids[row, :length] = torch.as_tensor(trajectory.tokens, dtype=torch.long)
            valid[row, :length] = True
            trained[row, :length] = torch.as_tensor(trajectory.trained)
            logprobs[row, :length] = torch.as_tensor(trajectory.logprobs)
            for position, reward in trajectory.rewards.items():
                rewards[row, position] = reward
        return RolloutBatch(
            prompt_ids=first.prompt_ids,
            prompt_mask=first.prompt_mask,
            response_ids=ids,
            response_mask=valid,
            logprobs=logprobs,
            response_texts=tuple(t.final_text for t in trajectories),
            group_size=first.group_size,
            loss_mask=trained,
            token_rewards=rewards if any(t.rewards for t in trajectories) else None,
            row_stats={
                name: torch.tensor([t.stats[name] for t in trajectories]) for name in ROW_STATS
            },
        )


def check_turns(config: Config, tokenizer: object) -> None:
    """What `make_agent_loop` needs of ``tokenizer``, without starting the sandbox: a chat
    template that can be cut into turns (``data.chat_template``), else a closing marker of
    one token (a turn stops on it). Raises ValueError saying which."""
    if config.data.chat_template:
        ChatTurns(tokenizer)
    else:
        single_token_id(tokenizer, config.agent.call_end, "agent.call_end")


def make_agent_loop(config: Config, tokenizer: object) -> AgentLoop | None:
    """The run's agent loop: None where ``agent.tools`` is empty (one-turn rollouts)."""
    if not config.agent.tools:
        return None
    chat = ChatTurns(tokenizer) if config.data.chat_template else None
    return AgentLoop(tokenizer, config.agent, config.rollout.max_new_tokens, chat)


def sample(
    engine: TokenEngine,
    agent: AgentLoop | None,
    prompts: Sequence[str],
    params: SamplingParams,
    seed: int | None,
) -> RolloutBatch:
    """One turn from ``engine``, or, with an agent loop, whole multi-turn trajectories."""
    if agent is None:
        return engine.generate(prompts, params, seed=seed)
    return agent.generate(engine, prompts, params, seed)


def _turn_seed(seed: int, turn: int) -> int:
    """Turn ``turn``'s sampling seed: its own stream, a function of the request's seed."""
    return (seed * 1_000_003 + turn * 7_919) & 0x7FFFFFFF


def agent_metrics(batch: RolloutBatch) -> dict[str, float]:
    """``agent/`` and ``tools/`` metrics of a multi-turn batch (empty for a single-turn one)."""
    stats: Mapping[str, Tensor] = batch.row_stats
    if "turns" not in stats:
        return {}
    rows = float(batch.rows)
    calls = float(stats["tool_calls"].sum())
    metrics = {
        "agent/turns_mean": float(stats["turns"].mean()),
        "agent/tool_calls_per_response": calls / rows,
        "agent/answered_frac": float(stats["ended_answer"].mean()),
        "agent/turn_cap_frac": float(stats["ended_turn_cap"].mean()),
        "agent/token_budget_frac": float(stats["ended_token_budget"].mean()),
        "agent/tool_token_frac": float(stats["tool_tokens"].sum())
        / max(1.0, float(batch.response_mask.sum())),
        "tools/calls": calls,
    }
    for status in STATUSES:
        metrics[f"tools/{status}"] = float(stats[f"tool_{status}"].sum())
    metrics["tools/failed_frac"] = (
        sum(metrics[f"tools/{status}"] for status in FAILED) / calls if calls else 0.0
    )
    return metrics

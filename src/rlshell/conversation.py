"""Conversations as tokens: what the model wrote is trained, everything else is context.

One rendering serves the SFT stage and the multi-turn rollout, so a model
fine-tuned on demonstrations sees at RL time exactly the token sequences it
was taught. A conversation is a list of `Message`s; `render_conversation`
turns it into token ids and a trained mask, one message after another, each
tokenised on its own (never across a message boundary, which is what makes a
rollout's concatenated turns and a rendered demonstration the same tokens):

- ``system`` and ``user``: their text, not trained;
- ``assistant``: its text, trained; the last assistant message also gets the
  tokenizer's EOS (trained: the model learns to stop). An assistant message
  followed by a ``tool`` message ends its turn with the tool call's closing
  marker instead (the marker is part of its text);
- ``tool``: ``result_start + content + result_end``, not trained.

The template is plain text (no role headers): the format the project's
character-level models are trained from scratch in. A model that comes with a
chat template uses the same roles; its headers would be untrained context
between the messages.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

import torch
from attrs import frozen
from jaxtyping import Bool, Int
from torch import Tensor

__all__ = [
    "ROLES",
    "Message",
    "RenderedConversation",
    "conversation_from_json",
    "read_conversations",
    "render_conversation",
    "tool_call_demonstrations",
    "tool_message_text",
    "write_conversations",
]

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[Role, ...] = ("system", "user", "assistant", "tool")
TRAINED_ROLES = frozenset({"assistant"})


@frozen
class Message:
    """One turn of a conversation: who speaks and what they say."""

    role: Role
    content: str

    def __attrs_post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"message role {self.role!r}: expected one of {', '.join(ROLES)}")


@frozen(eq=False)
class RenderedConversation:
    """A conversation's token ids and which of them are trained (the assistant's)."""

    ids: Int[Tensor, " tokens"]
    trained: Bool[Tensor, " tokens"]


def tool_message_text(content: str, result_start: str, result_end: str) -> str:
    """How a tool's output stands in the conversation: wrapped in the result markers."""
    return f"{result_start}{content}{result_end}"


def render_conversation(
    messages: Sequence[Message],
    tokenizer: object,
    result_start: str,
    result_end: str,
) -> RenderedConversation:
    """Token ids and trained mask of ``messages`` (see the module's rules).

    ``tokenizer``: a transformers tokenizer with an EOS token; each message
    is encoded without special tokens.
    """
    from transformers import PreTrainedTokenizerBase

    if not isinstance(tokenizer, PreTrainedTokenizerBase):
        raise TypeError(f"expected a transformers tokenizer, got {type(tokenizer).__name__}")
    if tokenizer.eos_token_id is None:
        raise ValueError("render_conversation: the tokenizer has no EOS token")
    if not messages:
        raise ValueError("render_conversation: the conversation has no message")
    last_assistant = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=None)
    if last_assistant is None:
        raise ValueError("render_conversation: the conversation has no assistant message")
    ids: list[int] = []
    trained: list[bool] = []
    for index, message in enumerate(messages):
        text = message.content
        if message.role == "tool":
            text = tool_message_text(text, result_start, result_end)
        piece = list(tokenizer.encode(text, add_special_tokens=False))
        if index == last_assistant:
            piece.append(int(tokenizer.eos_token_id))
        ids += piece
        trained += [message.role in TRAINED_ROLES] * len(piece)
    return RenderedConversation(
        ids=torch.tensor(ids, dtype=torch.long), trained=torch.tensor(trained, dtype=torch.bool)
    )


def conversation_from_json(record: object, where: str = "conversation") -> list[Message]:
    """A conversation from its JSON form: ``{"messages": [{"role": ..., "content": ...}, ...]}``
    (as TRL's and OpenAI's chat datasets write it). Errors name ``where`` and the message."""
    if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
        raise ValueError(f'{where}: expected an object with a "messages" list')
    messages = []
    for index, item in enumerate(record["messages"]):
        if not isinstance(item, dict):
            raise ValueError(f"{where}: message {index} is not an object")
        role, content = item.get("role"), item.get("content")
        if role not in ROLES:
            raise ValueError(
                f"{where}: message {index} has role {role!r}; expected one of {', '.join(ROLES)}"
            )
        if not isinstance(content, str):
            raise ValueError(f"{where}: message {index} has no string content")
        messages.append(Message(role, content))
    return messages


def read_conversations(path: str | Path) -> list[list[Message]]:
    """The conversations of a JSONL file, one ``{"messages": [...]}`` object per line."""
    conversations = []
    with Path(path).open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{where}: not JSON ({error.msg})") from None
            conversations.append(conversation_from_json(record, where))
    if not conversations:
        raise ValueError(f"{path}: no conversation in the file")
    return conversations


def write_conversations(path: str | Path, conversations: Iterable[Sequence[Message]]) -> None:
    """Write conversations as JSONL, the form `read_conversations` reads."""
    with Path(path).open("w", encoding="utf-8") as out:
        for messages in conversations:
            record = {"messages": [{"role": m.role, "content": m.content} for m in messages]}
            out.write(json.dumps(record) + "\n")


def tool_call_demonstrations(
    examples: Iterable[tuple[str, str]],
    call_start: str,
    call_end: str,
    tool: str | None = None,
) -> list[list[Message]]:
    """Demonstrations of a calculator call for prompts like ``"347*829="`` with their answers.

    Each is a conversation: the prompt; the call ``call_start + [tool + " "] + expression
    + call_end`` (the prompt without its ``=``; ``tool`` omitted when the format has it as
    the default); the tool's output, the answer; and the answer as the final turn. The SFT
    stage teaches the call format with them (`configs/sft_tool_calls.py`).
    """
    conversations = []
    for prompt, answer in examples:
        expression = prompt.removesuffix("=")
        body = expression if tool is None else f"{tool} {expression}"
        conversations.append(
            [
                Message("user", prompt),
                Message("assistant", f"{call_start}{body}{call_end}"),
                Message("tool", answer),
                Message("assistant", answer),
            ]
        )
    return conversations

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
character-level models are trained from scratch in.

A pretrained chat model is rendered in its own chat template instead
(`ChatTurns`, ``data.chat_template``): the messages before the first
assistant turn and that turn's header are one untrained piece (the prompt, as
`rlshell.data.render_chat` renders a prompt); each assistant message is its
text and the EOS token, trained; the template's text between an assistant's
EOS and the next assistant's first token (the end of the turn, the tool's or
user's turns, the next header) is one untrained piece. A tool's output is the
template's ``tool`` turn, without the result markers. Messages after the last
assistant message train nothing and are left out. The multi-turn rollout
appends the same pieces after a turn that ends with a call
(`rlshell.engines.rollout.multi_turn`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from attrs import frozen
from jaxtyping import Bool, Int
from torch import Tensor

__all__ = [
    "ROLES",
    "ChatTurns",
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


# Stand-ins for a user's and an assistant's text while the template's pieces are cut out.
_PROBE_USER = "\u00a4user\u00a4"
_PROBE_ASSISTANT = "\u00a4assistant\u00a4"


class ChatTurns:
    """A tokenizer's chat template cut into the pieces a conversation is rendered from turn
    by turn (the module's rules): `opening` before the first assistant turn, `between`
    after each. Raises ValueError for a tokenizer without a template or EOS token, and for
    a template that cannot be cut so: one that renders an earlier turn differently once a
    later one follows, or that does not end an assistant turn with the EOS token."""

    def __init__(self, tokenizer: object) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "data.chat_template: the model's tokenizer has no chat template (the "
                "character tokenizer of models built here has none); leave it false"
            )
        eos = getattr(tokenizer, "eos_token", None)
        if not eos:
            raise ValueError("data.chat_template: the tokenizer has no EOS token to end a turn")
        self.tokenizer = tokenizer
        self.eos = str(eos)
        probe = [Message("user", _PROBE_USER), Message("assistant", _PROBE_ASSISTANT)]
        rendered = self._render(probe, generation_prompt=False)
        after = rendered[rendered.rindex(_PROBE_ASSISTANT) + len(_PROBE_ASSISTANT) :]
        if not after.startswith(self.eos):
            raise ValueError(
                f"data.chat_template: this template ends an assistant turn with {after[:20]!r}, "
                f"not the EOS token {self.eos!r} the model stops on; its turns cannot be "
                "rendered as the rollout samples them"
            )
        self._probe, self._probe_text = probe, rendered
        # What the template writes after an assistant's EOS, before whatever comes next.
        self.turn_end = after[len(self.eos) :]
        self.between([Message("user", "0")])  # a template that cannot be cut fails here

    def _render(self, messages: Sequence[Message], generation_prompt: bool) -> str:
        try:
            return str(
                self.tokenizer.apply_chat_template(  # type: ignore[attr-defined]
                    [{"role": m.role, "content": m.content} for m in messages],
                    tokenize=False,
                    add_generation_prompt=generation_prompt,
                )
            )
        except Exception as error:  # Jinja's TemplateError, or what a template raises itself
            roles = [m.role for m in messages]
            raise ValueError(
                f"data.chat_template: the model's chat template cannot render the turns "
                f"{roles}: {error}"
            ) from error

    def opening(self, messages: Sequence[Message]) -> str:
        """``messages`` (those before the first assistant turn) and the assistant's header."""
        return self._render(messages, generation_prompt=True)

    def between(self, messages: Sequence[Message]) -> str:
        """The text after an assistant turn's EOS up to the next assistant turn's first
        token: the end of the turn, ``messages`` (tool or user turns), the next header."""
        following = self._render([*self._probe, *messages], generation_prompt=True)
        if not following.startswith(self._probe_text):
            raise ValueError(
                "data.chat_template: this template renders an earlier turn differently once a "
                f"later one follows ({[m.role for m in messages]} after an assistant turn); a "
                "conversation cannot be rendered turn by turn in it"
            )
        return self.turn_end + following[len(self._probe_text) :]


def render_conversation(
    messages: Sequence[Message],
    tokenizer: object,
    result_start: str,
    result_end: str,
    chat: ChatTurns | None = None,
) -> RenderedConversation:
    """Token ids and trained mask of ``messages`` (see the module's rules).

    ``tokenizer``: a transformers tokenizer with an EOS token; each message
    is encoded without special tokens. ``chat``: the tokenizer's chat template,
    which then renders the turns (the result markers are unused).
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
    if chat is not None:
        return _render_chat(messages[: last_assistant + 1], tokenizer, chat)
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


def _render_chat(
    messages: Sequence[Message], tokenizer: Any, chat: ChatTurns
) -> RenderedConversation:
    """`render_conversation` in ``chat``'s template; ``messages`` end with an assistant's."""
    pieces: list[tuple[list[int], bool]] = []
    context: list[Message] = []
    opened = False
    for message in messages:
        if message.role != "assistant":
            context.append(message)
            continue
        text = chat.between(context) if opened else chat.opening(context)
        pieces.append((list(tokenizer.encode(text, add_special_tokens=False)), False))
        turn = list(tokenizer.encode(message.content, add_special_tokens=False))
        pieces.append(([*turn, int(tokenizer.eos_token_id)], True))
        context, opened = [], True
    ids = [token for piece, _ in pieces for token in piece]
    trained = [flag for piece, flag in pieces for _ in piece]
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

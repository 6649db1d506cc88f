"""Tool calls in a model's text, and results written back: pure functions over strings.

A model calls a tool by writing a call between two tags; the rollout stops
generating at the closing tag, runs the call, and appends the result between
two other tags before the model goes on::

    fmt = ToolCallFormat()                      # <call>...</call>, <result>...</result>, plain
    call = parse_tool_call("So: <call>calculator 347*829</call>", fmt)
    # ToolCall(name='calculator', argument='347*829', text='<call>calculator 347*829</call>')
    format_result("287663", fmt)                # '<result>287663</result>'

Bodies. ``body="plain"``: the tool's name, one whitespace character (a space
or a newline), then the argument text, kept exactly (``<call>python
print(1)</call>``; whitespace before the name is skipped). With
``default_tool`` set the name is optional: a body whose first word is not one
of ``tools`` (or ``default_tool`` itself) is all argument of the default tool
(``<call>347*829</call>``). ``body="json"``: a JSON object
``{"name": ..., "arguments": ...}`` as Hermes / Qwen2.5 write tool calls
(``<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>``
with ``ToolCallFormat.hermes()``). ``arguments`` is the argument text itself
(a string), or an object holding it: its ``code`` field, else its
``expression`` field, else its one field; other fields next to ``code`` or
``expression`` are ignored. A JSON body without ``name`` calls
``default_tool`` when set.

Which call. `parse_tool_call` reads the last call of a turn: the text from
the last ``call_start`` to the first ``call_end`` after it. A turn with no
tag at all calls nothing (None). A last call that is not closed, a closing
tag with no opening one, an empty body, a missing name, bad JSON or JSON of
another shape are `ParseError`\\ s: their message is meant to be shown to the
model as the call's observation (`rlshell.tools.sandbox.ToolExecutor.run`
does). Parsing never raises on any text.
"""

from __future__ import annotations

import json
from typing import Literal

from attrs import field, frozen

__all__ = [
    "CallBody",
    "ParseError",
    "ToolCall",
    "ToolCallFormat",
    "format_call",
    "format_result",
    "parse_tool_call",
]

CallBody = Literal["plain", "json"]

# How much of a malformed call a ParseError's message quotes.
_QUOTE_CHARS = 120


def _non_empty(instance: object, attribute: object, value: str) -> None:
    if not isinstance(value, str) or not value:
        name = getattr(attribute, "name", "tag")
        raise ValueError(f"ToolCallFormat.{name}: expected a non-empty string, got {value!r}")


@frozen
class ToolCallFormat:
    """How calls and results are written in the model's text (module docstring: the bodies).

    ``call_start`` and ``call_end`` must differ and neither may contain the
    other (a parser could not tell them apart). ``tools``: for the plain body
    with a ``default_tool``, the names a body may start with.
    """

    call_start: str = field(default="<call>", validator=_non_empty)
    call_end: str = field(default="</call>", validator=_non_empty)
    result_start: str = field(default="<result>", validator=_non_empty)
    result_end: str = field(default="</result>", validator=_non_empty)
    body: CallBody = "plain"
    default_tool: str | None = None
    tools: tuple[str, ...] = ()

    def __attrs_post_init__(self) -> None:
        if self.body not in ("plain", "json"):
            raise ValueError(f"ToolCallFormat.body: expected 'plain' or 'json', got {self.body!r}")
        if self.call_start in self.call_end or self.call_end in self.call_start:
            raise ValueError(
                f"ToolCallFormat: call_start {self.call_start!r} and call_end {self.call_end!r} "
                "must differ and neither may contain the other"
            )
        for name in (self.default_tool, *self.tools):
            if name is not None and (not name or any(c.isspace() for c in name)):
                raise ValueError(f"ToolCallFormat: tool names are single words, got {name!r}")

    @classmethod
    def hermes(cls, default_tool: str | None = None) -> ToolCallFormat:
        """The Hermes / Qwen2.5 convention: ``<tool_call>{json}</tool_call>`` and
        ``<tool_response>...</tool_response>``."""
        return cls(
            call_start="<tool_call>",
            call_end="</tool_call>",
            result_start="<tool_response>",
            result_end="</tool_response>",
            body="json",
            default_tool=default_tool,
        )


@frozen
class ToolCall:
    """One parsed call: the tool's ``name``, its ``argument`` text, and the call's ``text``
    as the model wrote it, tags included."""

    name: str
    argument: str
    text: str


@frozen
class ParseError:
    """A malformed call: ``message`` says what was wrong (for the model to read), ``text``
    is the offending part of the turn."""

    message: str
    text: str


def parse_tool_call(text: str, fmt: ToolCallFormat) -> ToolCall | ParseError | None:
    """The last call in ``text`` (a model's turn), a `ParseError` when it is malformed, or
    None when ``text`` holds no call tag at all."""
    start = text.rfind(fmt.call_start)
    if start == -1:
        end = text.find(fmt.call_end)
        if end == -1:
            return None
        return ParseError(
            f"{fmt.call_end!r} without an opening {fmt.call_start!r}: write a call as "
            f"{_example(fmt)}",
            _quote(text[max(0, end - _QUOTE_CHARS) : end + len(fmt.call_end)]),
        )
    body_start = start + len(fmt.call_start)
    end = text.find(fmt.call_end, body_start)
    if end == -1:
        return ParseError(
            f"unclosed call: {fmt.call_start!r} without a closing {fmt.call_end!r}",
            _quote(text[start:]),
        )
    call_text = text[start : end + len(fmt.call_end)]
    body = text[body_start:end]
    if not body.strip():
        return ParseError(f"empty call: write a call as {_example(fmt)}", call_text)
    if fmt.body == "json":
        return _parse_json_body(body, call_text, fmt)
    return _parse_plain_body(body, call_text, fmt)


def format_call(name: str, argument: str, fmt: ToolCallFormat) -> str:
    """The text of a call `parse_tool_call` reads back as ``ToolCall(name, argument, ...)``
    (the name always written). A ValueError where no such text exists: a name with
    whitespace, or a plain argument holding a call tag."""
    if not name or any(character.isspace() for character in name):
        raise ValueError(f"tool names are single words without whitespace, got {name!r}")
    if fmt.body == "json":
        body = json.dumps({"name": name, "arguments": argument}, ensure_ascii=True)
        # In JSON text '<', '>' and '/' occur only inside strings, where escapes mean the same.
        body = body.replace("<", "\\u003c").replace(">", "\\u003e").replace("/", "\\/")
    else:
        body = f"{name} {argument}"
    text = f"{fmt.call_start}{body}{fmt.call_end}"
    # The text must read back as this call: the tags must not occur in the body, nor across
    # its edges, and a plain name must be one the format recognises.
    parsed = parse_tool_call(text, fmt)
    if not (isinstance(parsed, ToolCall) and (parsed.name, parsed.argument) == (name, argument)):
        if fmt.body == "plain" and fmt.default_tool not in (None, name) and name not in fmt.tools:
            raise ValueError(
                f"tool {name!r} is not among ToolCallFormat.tools {list(fmt.tools)}: with "
                f"default_tool {fmt.default_tool!r} its call would read as the default tool's"
            )
        raise ValueError(
            f"a call to {name!r} cannot be written in the {fmt.body} format: its body would "
            f"hold {fmt.call_start!r} or {fmt.call_end!r} ({_quote(argument)!r})"
        )
    return text


def format_result(observation: str, fmt: ToolCallFormat) -> str:
    """``observation`` between the result tags, as it is appended after the call."""
    return f"{fmt.result_start}{observation}{fmt.result_end}"


def _parse_plain_body(body: str, call_text: str, fmt: ToolCallFormat) -> ToolCall | ParseError:
    stripped = body.lstrip()
    words = stripped.split(maxsplit=1)
    name = words[0]
    # The argument starts one whitespace character after the name, and is kept exactly.
    argument = stripped[len(name) + 1 :]
    if fmt.default_tool is not None and name not in {fmt.default_tool, *fmt.tools}:
        return ToolCall(fmt.default_tool, body, call_text)
    return ToolCall(name, argument, call_text)


def _parse_json_body(body: str, call_text: str, fmt: ToolCallFormat) -> ToolCall | ParseError:
    shape = (
        'a JSON object {"name": <tool>, "arguments": <text, or an object with '
        'a "code" or "expression" field or a single field>}'
    )
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as error:
        return ParseError(f"the call is not valid JSON ({error}); expected {shape}", call_text)
    if not isinstance(value, dict):
        return ParseError(f"the call is JSON {type(value).__name__}; expected {shape}", call_text)
    unknown = sorted(set(value) - {"name", "arguments"})
    if unknown:
        return ParseError(f"unexpected keys {unknown} in the call; expected {shape}", call_text)
    name = value.get("name", fmt.default_tool)
    if name is None:
        return ParseError(f'the call has no "name"; expected {shape}', call_text)
    if not isinstance(name, str) or not name or any(c.isspace() for c in name):
        return ParseError(f'"name" must be a tool name (one word), got {name!r}', call_text)
    if "arguments" not in value:
        return ParseError(f'the call has no "arguments"; expected {shape}', call_text)
    argument = _argument_text(value["arguments"])
    if argument is None:
        given = _quote(json.dumps(value["arguments"]))
        return ParseError(
            f'"arguments" must be text or an object holding it, got {given}; expected {shape}',
            call_text,
        )
    return ToolCall(name, argument, call_text)


def _argument_text(arguments: object) -> str | None:
    """The argument text of a JSON call's ``arguments`` (module docstring), or None."""
    if isinstance(arguments, str):
        return arguments
    if not isinstance(arguments, dict):
        return None
    for key in ("code", "expression"):
        if isinstance(arguments.get(key), str):
            text: str = arguments[key]
            return text
    if len(arguments) == 1:
        (only,) = arguments.values()
        return only if isinstance(only, str) else None
    return None


def _example(fmt: ToolCallFormat) -> str:
    if fmt.body == "json":
        return f'{fmt.call_start}{{"name": "<tool>", "arguments": "<text>"}}{fmt.call_end}'
    return f"{fmt.call_start}<tool> <argument>{fmt.call_end}"


def _quote(text: str) -> str:
    return text if len(text) <= _QUOTE_CHARS else text[: _QUOTE_CHARS - 3] + "..."

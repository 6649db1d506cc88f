"""Tools: the call parser, the calculator, the python tool, and the sandbox's limits.

Parsing and the calculator are pure: properties first, then hand cases. The
sandbox tests share one executor (a sandbox process imports torch, seconds
of start-up) serving the built-ins, the tools of `tool_ext` (an extension
module beside this file, so the spawned processes register them too) and
``reverse``, a function of this module shipped in ``RLSHELL_EXT_OBJECTS``.
"""

from __future__ import annotations

import ast
import ctypes
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from rlshell.extensions import encode_registrations, shipping
from rlshell.tools import TOOLS, ToolError, get_tool, register_tool, tool_is_pure
from rlshell.tools.calculator import MAX_RESULT_DIGITS, calculate, calculator_tool
from rlshell.tools.parsing import (
    ParseError,
    ToolCall,
    ToolCallFormat,
    format_call,
    format_result,
    parse_tool_call,
)
from rlshell.tools.python_tool import run_python
from rlshell.tools.sandbox import ToolExecutor, ToolLimits, ToolResult, tool_metrics
from rlshell.tools.sandbox_process import compose_observation

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# Long enough that a 50 MB print finishes well within it on a loaded 2-core machine.
TIMEOUT_S = 2.0
# A call past its deadline is killed at once; reading and answering take well under this.
SLACK_S = 3.0
MAX_CHARS = 1000
NAMES = ["calculator", "python", "shout", "not_text", "runner_pid", "reverse"]

FORMATS = [
    ToolCallFormat(),
    ToolCallFormat(default_tool="calculator", tools=("python",)),
    ToolCallFormat(body="json"),
    ToolCallFormat.hermes(),
    ToolCallFormat(call_start="[[", call_end="]]", result_start="((", result_end="))"),
]
TAG_CHARACTERS = "<>[]/"

names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.-]{0,12}", fullmatch=True)


def call(name: str, argument: str) -> ToolCall:
    return ToolCall(name, argument, f"<call>{name} {argument}</call>")


# ---------------------------------------------------------------------------- parsing


@given(
    fmt=st.sampled_from(FORMATS),
    name=names,
    argument=st.text(),
    prefix=st.text(),
)
def test_a_formatted_call_reads_back_after_any_text(
    fmt: ToolCallFormat, name: str, argument: str, prefix: str
) -> None:
    """JSON bodies carry any argument; plain ones any without the tags' characters."""
    if fmt.body == "plain":
        argument = "".join(c for c in argument if c not in TAG_CHARACTERS)
        if fmt.default_tool is not None:
            name = fmt.default_tool
    text = format_call(name, argument, fmt)
    assert parse_tool_call(prefix + text, fmt) == ToolCall(name, argument, text)


@given(fmt=st.sampled_from(FORMATS), observation=st.text())
def test_a_result_is_the_observation_between_the_result_tags(
    fmt: ToolCallFormat, observation: str
) -> None:
    text = format_result(observation, fmt)
    assert text.startswith(fmt.result_start)
    assert text.endswith(fmt.result_end)
    assert text[len(fmt.result_start) : len(text) - len(fmt.result_end)] == observation


# Pieces of text a model might write, tags and JSON fragments included.
PIECES = [
    *("<call>", "</call>", "<tool_call>", "</tool_call>", "[[", "]]", "calculator", "python"),
    *(" ", "\n", "1+1", "{", "}", '"name"', '"arguments"', ":", ",", '"x"', "[", "]", "null"),
]


@given(fmt=st.sampled_from(FORMATS), text=st.lists(st.sampled_from(PIECES)).map("".join))
def test_parsing_never_raises_and_a_call_is_the_last_tag_pair(
    fmt: ToolCallFormat, text: str
) -> None:
    parsed = parse_tool_call(text, fmt)
    last_start = text.rfind(fmt.call_start)
    if parsed is None:
        assert last_start == -1
        assert fmt.call_end not in text
    elif isinstance(parsed, ToolCall):
        assert text.rfind(parsed.text) == last_start
        assert parsed.text.endswith(fmt.call_end)
        assert parsed.name
    else:
        assert isinstance(parsed, ParseError)
        assert parsed.message


WRONG_SHAPES = [
    *("[1, 2]", '"calculator 1+1"', "12", "null", '{"name": "python"}', '{"arguments": "1+1"}'),
    *('{"name": 3, "arguments": "1"}', '{"name": "a b", "arguments": "1"}'),
    '{"name": "python", "arguments": 3}',
    '{"name": "python", "arguments": {"a": "1", "b": "2"}}',
    '{"name": "python", "arguments": {"code": 1}}',
    '{"name": "python", "arguments": "x", "id": 1}',
]
malformed_json_bodies = st.one_of(
    st.text().filter(lambda t: t.strip() and not _is_json(t)),  # not JSON at all
    st.sampled_from(WRONG_SHAPES),
)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


@given(body=malformed_json_bodies, prefix=st.text())
def test_every_malformed_json_call_is_a_parse_error(body: str, prefix: str) -> None:
    fmt = ToolCallFormat.hermes()
    assume(fmt.call_start not in body and fmt.call_end not in body)
    parsed = parse_tool_call(f"{prefix}<tool_call>{body}</tool_call>", fmt)
    assert isinstance(parsed, ParseError), parsed
    assert parsed.text == f"<tool_call>{body}</tool_call>"


@given(fmt=st.sampled_from(FORMATS), prefix=st.text(), body=st.text(), blank=st.text(" \n\t"))
def test_unclosed_orphaned_and_empty_calls_are_parse_errors(
    fmt: ToolCallFormat, prefix: str, body: str, blank: str
) -> None:
    body = "".join(c for c in body if c not in TAG_CHARACTERS)
    unclosed = parse_tool_call(f"{prefix}{fmt.call_start}{body}", fmt)
    assert isinstance(unclosed, ParseError)
    assert "unclosed" in unclosed.message
    clean_prefix = prefix.replace(fmt.call_start, "")
    assume(fmt.call_start not in clean_prefix)
    orphaned = parse_tool_call(f"{clean_prefix}{body}{fmt.call_end}", fmt)
    assert isinstance(orphaned, ParseError)
    assert "without an opening" in orphaned.message
    empty = parse_tool_call(f"{prefix}{fmt.call_start}{blank}{fmt.call_end}", fmt)
    assert isinstance(empty, ParseError)
    assert "empty call" in empty.message


def test_plain_calls_by_hand() -> None:
    fmt = ToolCallFormat()
    assert parse_tool_call("So: <call>calculator 347*829</call>", fmt) == ToolCall(
        "calculator", "347*829", "<call>calculator 347*829</call>"
    )
    # The name may follow whitespace and precede a newline; the argument is kept exactly.
    code = parse_tool_call("<call> python\nx = 1\n  print(x)\n</call>", fmt)
    assert isinstance(code, ToolCall)
    assert (code.name, code.argument) == (
        "python",
        "x = 1\n  print(x)\n",
    )
    # The last call counts; an earlier unclosed one does not matter.
    two = parse_tool_call("<call>python 1 <call>calculator 2</call> then", fmt)
    assert isinstance(two, ToolCall)
    assert (two.name, two.argument) == ("calculator", "2")
    assert parse_tool_call("no call here", fmt) is None
    assert isinstance(parse_tool_call("<call>calculator 1</call><call>calcu", fmt), ParseError)


def test_the_default_tool_takes_a_body_without_a_known_name() -> None:
    fmt = ToolCallFormat(default_tool="calculator", tools=("python",))
    assert parse_tool_call("<call>347*829</call>", fmt) == ToolCall(
        "calculator", "347*829", "<call>347*829</call>"
    )
    explicit = parse_tool_call("<call>python print(1)</call>", fmt)
    assert isinstance(explicit, ToolCall)
    assert (explicit.name, explicit.argument) == (
        "python",
        "print(1)",
    )
    # A first word that is no known tool is part of the default tool's argument.
    assert parse_tool_call("<call>x = 1</call>", fmt) == ToolCall(
        "calculator", "x = 1", "<call>x = 1</call>"
    )
    with pytest.raises(ValueError, match=r"not among ToolCallFormat\.tools"):
        format_call("shout", "hi", fmt)


def test_json_calls_by_hand() -> None:
    fmt = ToolCallFormat.hermes(default_tool="python")
    hermes = '<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call>'
    assert parse_tool_call(hermes, fmt) == ToolCall("python", "print(1)", hermes)
    arguments = '{"expression": "2+2", "note": 1}'
    expression = f'<tool_call>{{"name": "calculator", "arguments": {arguments}}}</tool_call>'
    parsed = parse_tool_call(expression, fmt)
    assert isinstance(parsed, ToolCall)
    assert (parsed.name, parsed.argument) == ("calculator", "2+2")
    single = parse_tool_call(
        '<tool_call>{"name": "shout", "arguments": {"text": "hi"}}</tool_call>', fmt
    )
    assert isinstance(single, ToolCall)
    assert single.argument == "hi"
    nameless = parse_tool_call('<tool_call>{"arguments": "1+1"}</tool_call>', fmt)
    assert isinstance(nameless, ToolCall)
    assert nameless.name == "python"
    bad = parse_tool_call('<tool_call>{"name": "python", arguments: 1}</tool_call>', fmt)
    assert isinstance(bad, ParseError)
    assert bad.message.startswith("the call is not valid JSON")
    # The tags inside an argument are escaped, so any argument travels.
    text = format_call("python", 'print("</tool_call>")', fmt)
    assert "</tool_call>" not in text[: -len("</tool_call>")]
    assert parse_tool_call(text, fmt) == ToolCall("python", 'print("</tool_call>")', text)


def test_formats_that_could_not_be_parsed_are_refused() -> None:
    with pytest.raises(ValueError, match="must differ"):
        ToolCallFormat(call_start="<call>", call_end="<call>")
    with pytest.raises(ValueError, match="neither may contain"):
        ToolCallFormat(call_start="<", call_end="</")
    with pytest.raises(ValueError, match="non-empty"):
        ToolCallFormat(result_end="")
    with pytest.raises(ValueError, match="'plain' or 'json'"):
        ToolCallFormat(body="yaml")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cannot be written"):
        format_call("python", "print('</call>')", ToolCallFormat())


# ---------------------------------------------------------------------------- the calculator


def expressions(depth: int = 3) -> st.SearchStrategy[str]:
    """Parenthesised arithmetic over small integers and floats; powers have small exponents."""
    numbers = st.one_of(
        st.integers(0, 1000).map(str),
        st.floats(0, 1e6, allow_nan=False, allow_infinity=False).map(repr),
    )
    if depth == 0:
        return numbers
    inner = expressions(depth - 1)
    binary = st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "//", "%"]), inner)
    power = st.tuples(inner, st.just("**"), st.integers(-3, 4).map(lambda e: f"({e})"))
    return st.one_of(
        numbers,
        st.one_of(binary, power).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        inner.map(lambda e: f"-{e}"),
    )


@given(expressions())
def test_the_calculator_agrees_with_python(expression: str) -> None:
    try:
        expected = eval(compile(ast.parse(expression, mode="eval"), "<test>", "eval"))
    except (ZeroDivisionError, OverflowError):
        expected = None
    if isinstance(expected, complex) or (
        isinstance(expected, float) and not math.isfinite(expected)
    ):
        expected = None
    if expected is None:
        with pytest.raises(ToolError):
            calculate(expression)
        return
    value = calculate(expression)
    assert type(value) is type(expected)
    assert value == expected
    written = calculator_tool(expression)
    assert (int(written) if isinstance(expected, int) else float(written)) == expected


@pytest.mark.parametrize(
    ("expression", "written"),
    [
        ("347*829", "287663"),
        (" 2 + 3 * 4 ", "14"),
        ("-2**2", "-4"),
        ("2**3**2", "512"),
        ("6/3", "2"),
        ("7/2", "3.5"),
        ("-7//2", "-4"),
        ("7 % -3", "-2"),
        ("2**-2", "0.25"),
        ("0.1+0.2", "0.30000000000000004"),
        ("1_000*2", "2000"),
        ("1e3/4", "250"),
        ("10**999 // 10**998", "10"),
    ],
)
def test_calculator_by_hand(expression: str, written: str) -> None:
    assert calculator_tool(expression) == written


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("1/0", "division by zero"),
        ("0**-1", "division by zero"),
        ("", "empty expression"),
        ("1+", "invalid expression"),
        ("2^10", "write \\*\\*"),
        ("x+1", "name 'x'"),
        ("abs(-1)", "function call"),
        ("True+1", "unsupported literal"),
        ("1j*1", "unsupported literal"),
        ("1 < 2", "unsupported syntax"),
        ("9**9**9", f"more than {MAX_RESULT_DIGITS} digits"),
        ("10**1000", f"more than {MAX_RESULT_DIGITS} digits"),
        ("(10**600)*(10**600)", f"more than {MAX_RESULT_DIGITS} digits"),
        ("1e308*10", "not a finite number"),
        ("2.0**5000", "too large for a float"),
        ("(-8)**0.5", "not a real number"),
        ("(" * 300 + "1" + ")" * 300, "nested|invalid"),
    ],
)
def test_calculator_refusals(expression: str, message: str) -> None:
    start = time.perf_counter()
    with pytest.raises(ToolError, match=message):
        calculator_tool(expression)
    assert time.perf_counter() - start < 0.5  # a refused power is never computed


def test_the_python_tool_in_this_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_python("x = 6 * 7\nprint(x)\nx + 1") == "43"
    assert capsys.readouterr().out == "42\n"
    assert run_python("print('no value')\nNone") == ""
    assert run_python("import sys\nsys.exit(0)") == ""
    with pytest.raises(ToolError, match="exited with status 2"):
        run_python("import sys\nsys.exit(2)")
    with pytest.raises(ToolError, match=r"(?s)line 2, in f\n    return 1 / 0\n.*ZeroDivisionError"):
        run_python("def f():\n    return 1 / 0\nf()")
    with pytest.raises(ToolError, match="SyntaxError"):
        run_python("def (:")


def test_registry_names_and_purity() -> None:
    assert tool_is_pure("calculator")
    assert not tool_is_pure("python")
    assert get_tool("calculator") is calculator_tool
    with pytest.raises(KeyError, match="did you mean 'calculator'"):
        get_tool("calcualtor")
    with pytest.raises(ValueError, match="single words"):
        register_tool("two words", calculator_tool)
    with pytest.raises(KeyError, match="already registered with pure=True"):
        register_tool("calculator", calculator_tool)


def test_an_observation_is_cut_with_a_note_and_keeps_its_failure() -> None:
    text, cut = compose_observation(["out", "err\n", ""], None, 100)
    assert (text, cut) == ("out\nerr\n", False)
    text, cut = compose_observation(["x" * 50], "ValueError: v", 30)
    assert cut
    assert text == "x" * 10 + "\n[output cut: 40 more characters not shown]\nerror: ValueError: v"
    text, cut = compose_observation(["x" * 5], "T" * 40 + "end", 20, cut_bytes=7)
    assert cut
    assert text.endswith("error: ... " + ("T" * 40 + "end")[-10:])
    assert "about 12 more" in text


# ---------------------------------------------------------------------------- the sandbox


def reverse(argument: str) -> str:
    return argument[::-1]


def _without_sys_admin() -> None:
    """In a child before exec: drop CAP_SYS_ADMIN from the bounding set, so the program
    exec'd (even as root) never has it."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(24, 21, 0, 0, 0) != 0:  # PR_CAPBSET_DROP, CAP_SYS_ADMIN
        raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


REFUSAL = (
    "from rlshell.tools.sandbox import SandboxError, ToolExecutor, ToolLimits\n"
    "for isolation in ('sandbox', 'weak'):\n"
    "    try:\n"
    "        ToolExecutor(['calculator'], ToolLimits(isolation=isolation))\n"
    "    except SandboxError as error:\n"
    "        print('refused:', error)\n"
)


@pytest.fixture(scope="module")
def refusal_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[subprocess.Popen[str]]:
    """A process that starts an executor where no network namespace can be made (it lacks
    CAP_SYS_ADMIN). It imports torch twice (itself, its sandbox process), so `executor`
    starts it first and it runs beside the start-up and the tests."""
    scratch = tmp_path_factory.mktemp("refusal")
    process = subprocess.Popen(
        [sys.executable, "-c", REFUSAL],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(scratch)},
        preexec_fn=_without_sys_admin,
    )
    yield process
    process.communicate(timeout=120)  # it ends by itself; killed, it would leave its scratch


@pytest.fixture(scope="module")
def executor(refusal_run: subprocess.Popen[str]) -> Iterator[ToolExecutor]:
    """Two sandbox processes serving `NAMES` under small limits, with `tool_ext` loaded and
    ``reverse`` shipped as a pickled registration."""
    payload = encode_registrations({"reverse tool": partial(register_tool, "reverse", reverse)})
    register_tool("reverse", reverse)  # shipping sends; registering here is the caller's
    with pytest.MonkeyPatch.context() as patch:
        path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
        patch.setenv("PYTHONPATH", path)
        patch.setenv("RLSHELL_EXT_MODULE", "tool_ext")
        patch.syspath_prepend(str(HERE))
        limits = ToolLimits(
            timeout_s=TIMEOUT_S, memory_mb=128, max_output_chars=MAX_CHARS, max_file_mb=1
        )
        try:
            with shipping(payload), ToolExecutor(NAMES, limits, num_processes=2) as tools:
                yield tools
        finally:
            TOOLS.unregister("reverse")


def run_one(executor: ToolExecutor, name: str, argument: str) -> ToolResult:
    (result,) = executor.run([call(name, argument)])
    return result


def test_calls_return_their_observations(executor: ToolExecutor) -> None:
    results = executor.run(
        [
            call("calculator", "347*829"),
            call("calculator", "1/0"),
            call("python", "print('hi')\nimport sys\nprint('warn', file=sys.stderr)\n6 * 7"),
            call("shout", "hello"),
            call("reverse", "abc"),
            call("not_text", ""),
        ]
    )
    assert [(r.status, r.observation) for r in results] == [
        ("ok", "287663"),
        ("error", "error: division by zero"),
        ("ok", "hi\nwarn\n42"),
        ("ok", "HELLO!"),
        ("ok", "cba"),
        ("error", "error: the tool returned int, expected str"),
    ]
    assert all(0 < r.seconds < SLACK_S for r in results)


def test_hangs_time_out_and_the_executor_serves_on(executor: ToolExecutor) -> None:
    start = time.monotonic()
    results = executor.run(
        [
            call("python", "while True:\n    pass"),
            call("python", "print('before', flush=True)\nimport time\ntime.sleep(100)"),
            call("calculator", "1+1"),
        ]
    )
    elapsed = time.monotonic() - start
    assert [r.status for r in results] == ["timeout", "timeout", "ok"]
    assert results[1].observation.startswith("before\n")
    assert f"did not finish within {TIMEOUT_S:g} s and was killed" in results[0].observation
    assert all(TIMEOUT_S <= r.seconds < TIMEOUT_S + SLACK_S for r in results[:2])
    assert elapsed < TIMEOUT_S + SLACK_S  # the two hangs ran side by side
    assert run_one(executor, "python", "print(2)").observation == "2\n"


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        ("import ctypes\nctypes.string_at(0)", "crashed", "died of SIGSEGV (signal 11)"),
        ("import os\nprint('bye', flush=True)\nos._exit(3)", "crashed", "exited with code 3"),
        ("print('so far')\nraise ValueError('boom')", "error", "line 2, in <module>"),
        ("data = bytearray(2 * 1024**3)", "memory", "ran out of memory (limit: 128 MB"),
        # bytes(n) takes fresh zero pages without touching them: fast even on a loaded machine.
        ("chunks = []\nwhile True:\n    chunks.append(bytes(2**20))", "memory", "out of memory"),
    ],
)
def test_failures_are_observations(
    executor: ToolExecutor, code: str, status: str, expected: str
) -> None:
    result = run_one(executor, "python", code)
    assert result.status == status, result
    assert expected in result.observation
    if code.startswith("print('so far')"):
        assert result.observation.startswith("so far\nerror: Traceback")
        assert result.observation.endswith("ValueError: boom")
    assert run_one(executor, "calculator", "2*3").observation == "6"


def _peak_rss_reset(pid: int) -> int:
    """The current RSS (kB) of ``pid``, after resetting its peak (VmHWM) to it."""
    with open(f"/proc/{pid}/clear_refs", "w") as refs:
        refs.write("5")
    return _status_kb(pid, "VmRSS")


def _status_kb(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith(key + ":"))
    return int(line.split()[1])


def test_a_flood_of_output_is_cut_quickly_without_filling_memory(executor: ToolExecutor) -> None:
    pids = [os.getpid(), *executor.pids]
    before = {pid: _peak_rss_reset(pid) for pid in pids}
    start = time.monotonic()
    result = run_one(executor, "python", "print('x' * 50_000_000)\nprint('never seen')")
    assert time.monotonic() - start < SLACK_S
    assert result.status == "truncated"
    head, note = result.observation.rsplit("\n", 1)
    assert head == "x" * MAX_CHARS
    assert note == "[output cut: about 49,999,012 more characters not shown]"
    for pid in pids:  # this process and the sandbox processes never held the 50 MB
        assert _status_kb(pid, "VmHWM") - before[pid] < 20_000, pid
    endless = run_one(executor, "python", "while True:\n    print('y' * 100_000)")
    assert endless.status == "truncated"
    assert endless.seconds < TIMEOUT_S
    assert endless.observation.endswith("MiB and was stopped]")


def test_a_tool_runs_without_network(executor: ToolExecutor) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.2)
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            f"socket.create_connection(('127.0.0.1', {port}), timeout=0.5)\n"
            "print('connected')"
        )
        result = run_one(executor, "python", code)
        assert result.status == "error"
        # The call's own network namespace: nothing in it, its loopback down.
        assert "[Errno 101] Network is unreachable" in result.observation
        assert "connected" not in result.observation
        with pytest.raises(TimeoutError):
            server.accept()
        # The same connection from here works: the server was listening.
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            server.accept()[0].close()


def test_with_network_true_a_call_reaches_the_machines_network() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=5)\n'up'"
        with ToolExecutor(["python"], ToolLimits(network=True)) as tools:
            result = run_one(tools, "python", code)
        assert (result.status, result.observation) == ("ok", "'up'")
        server.settimeout(5)
        server.accept()[0].close()


def test_a_tool_cannot_undo_its_limits(executor: ToolExecutor) -> None:
    code = (
        "import ctypes, os, resource\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('unshare', libc.unshare(0x40000000), os.strerror(ctypes.get_errno()))\n"
        "try:\n"
        "    resource.setrlimit(resource.RLIMIT_AS, (-1, -1))\n"
        "except ValueError as error:\n"
        "    print('setrlimit', error)\n"
        "fd = os.open('/proc/1/ns/net', os.O_RDONLY)  # its own: it is pid 1 there\n"
        "print('setns', libc.setns(fd, 0), os.strerror(ctypes.get_errno()))"
    )
    result = run_one(executor, "python", code)
    assert result.observation == (
        "unshare -1 Operation not permitted\n"
        "setrlimit not allowed to raise maximum limit\n"
        "setns -1 Operation not permitted\n"
    )


def test_the_dropped_capabilities_are_gone_from_every_set_and_cannot_come_back(
    executor: ToolExecutor,
) -> None:
    # CAP_SYS_PTRACE (19), CAP_SYS_ADMIN (21), CAP_SYS_RESOURCE (24): the effective,
    # permitted, inheritable and bounding sets as the kernel reports them, then an attempt
    # to set CAP_SYS_ADMIN again in the effective and permitted sets (capset).
    code = (
        "import ctypes, os\n"
        "sets = {}\n"
        "for line in open('/proc/self/status'):\n"
        "    name, _, value = line.partition(':')\n"
        "    if name in ('CapEff', 'CapPrm', 'CapInh', 'CapBnd'):\n"
        "        sets[name] = int(value, 16)\n"
        "dropped = 1 << 19 | 1 << 21 | 1 << 24\n"
        "print(sorted(name for name, mask in sets.items() if mask & dropped))\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "header = (ctypes.c_uint32 * 2)(0x20080522, 0)\n"
        "data = (ctypes.c_uint32 * 6)()\n"
        "libc.capget(ctypes.byref(header), ctypes.byref(data))\n"
        "data[0] |= 1 << 21\n"
        "data[1] |= 1 << 21\n"
        "print('capset', libc.capset(ctypes.byref(header), ctypes.byref(data)), "
        "os.strerror(ctypes.get_errno()))"
    )
    result = run_one(executor, "python", code)
    assert result.observation == "[]\ncapset -1 Operation not permitted\n"


def test_each_call_works_in_a_scratch_directory_removed_after_it(executor: ToolExecutor) -> None:
    code = (
        "import os, tempfile\n"
        "open('out.txt', 'w').write('hi')\n"
        "print(os.getcwd(), tempfile.gettempdir(), sorted(os.listdir()))"
    )
    first, second = (run_one(executor, "python", code) for _ in range(2))
    cwd, tmp, listing = first.observation.split(" ", 2)
    assert (first.status, tmp, listing) == ("ok", cwd, "['out.txt']\n")
    assert cwd != os.getcwd()
    assert not os.path.exists(cwd)
    assert not os.path.exists("out.txt")
    assert second.observation.split(" ")[0] != cwd
    big = run_one(executor, "python", "open('big', 'wb').write(b'0' * 2 * 2**20)")
    assert big.status == "error"
    assert "File too large" in big.observation


def test_unknown_tools_and_parse_errors_never_run(executor: ToolExecutor) -> None:
    fmt = ToolCallFormat()
    parsed = [
        parse_tool_call(text, fmt) for text in ["<call>calcualtor 1</call>", "<call>python 1"]
    ]
    assert all(p is not None for p in parsed)
    results = executor.run([p for p in parsed if p is not None])
    assert [(r.status, r.seconds) for r in results] == [("unknown_tool", 0.0), ("parse_error", 0.0)]
    assert results[0].observation.startswith(
        "error: unknown tool 'calcualtor' (did you mean 'calculator'?)"
    )
    assert results[1].observation.startswith("error: unclosed call")
    metrics = tool_metrics([*results, ToolResult("1", "ok", 0.5), ToolResult("", "timeout", 1.5)])
    assert metrics == {
        "tools/calls": 4.0,
        "tools/ok_frac": 0.25,
        "tools/errors": 0.0,
        "tools/timeouts": 1.0,
        "tools/crashes": 0.0,
        "tools/memory": 0.0,
        "tools/truncated": 0.0,
        "tools/unknown": 1.0,
        "tools/parse_errors": 1.0,
        "tools/seconds_mean": 1.0,
        "tools/seconds_max": 1.5,
    }


def test_pure_tools_share_a_process_and_others_never_do(executor: ToolExecutor) -> None:
    pids = [run_one(executor, "runner_pid", "").observation for _ in range(3)]
    python_pids = [
        run_one(
            executor, "python", "from tool_ext import process_identity\nprocess_identity()"
        ).observation
        for _ in range(2)
    ]
    # Each sandbox process keeps one runner for pure tools; the calls went to either process.
    assert len(set(pids)) <= 2
    assert len(set(python_pids)) == 2
    assert not set(python_pids) & set(pids)
    assert run_one(executor, "runner_pid", "hang").status == "timeout"
    after = {run_one(executor, "runner_pid", "").observation for _ in range(4)}
    assert len(after - set(pids)) >= 1  # the hung runner was replaced


def test_a_sandbox_process_that_dies_is_replaced(executor: ToolExecutor) -> None:
    # A call cannot kill its sandbox process: it is pid 1 of a PID namespace of its own, its
    # parent out of sight, and the sandbox's pids name nothing there...
    server = executor.pids[0]
    refused = run_one(
        executor,
        "python",
        f"import os, signal\nprint(os.getpid(), os.getppid())\nos.kill({server}, signal.SIGKILL)",
    )
    assert refused.status == "error"
    assert refused.observation.startswith("1 0\n"), refused.observation
    assert "ProcessLookupError" in refused.observation

    # ... but one that dies (killed from outside here) fails the call it was running, and
    # is replaced.
    def kill_soon() -> None:
        time.sleep(0.5)
        os.kill(executor.pids[0], signal.SIGKILL)

    killer = threading.Thread(target=kill_soon)
    killer.start()
    results = executor.run([call("python", "import time\ntime.sleep(3)") for _ in range(2)])
    killer.join()
    (died,) = [r for r in results if r.status == "crashed"]
    assert "tool sandbox process (pid" in died.observation
    assert "died of SIGKILL" in died.observation
    results = executor.run([call("calculator", f"{i}*2") for i in range(20)])
    assert [r.observation for r in results] == [str(i * 2) for i in range(20)]


def test_unknown_names_are_refused_before_anything_starts() -> None:
    with pytest.raises(KeyError, match="did you mean 'python'"):
        ToolExecutor(["pyhton"])
    with pytest.raises(ValueError, match="distinct"):
        ToolExecutor(["python", "python"])
    with pytest.raises(ValueError, match="timeout_s"):
        ToolLimits(timeout_s=0)


def test_without_a_network_namespace_the_executor_refuses_to_start(
    refusal_run: subprocess.Popen[str],
) -> None:
    stdout, stderr = refusal_run.communicate(timeout=120)
    assert refusal_run.returncode == 0, stderr
    sandbox, weak = stdout.splitlines()
    # The sandbox names the part the host withholds, how to allow it, and the opt-out.
    assert sandbox.startswith(
        "refused: the tool sandbox cannot start on this host: namespaces: bubblewrap could "
        "not start a sandbox here"
    )
    assert "opt out with ToolLimits(isolation='weak')" in sandbox
    # The weak opt-out still refuses to run tools on the host's network, and says so.
    assert weak.startswith("refused: tool sandbox process")
    assert "unshare(CLONE_NEWNET) failed with EPERM (Operation not permitted)" in weak
    assert "pass ToolLimits(network=True)" in weak
    assert "run with weak isolation" in stderr


def test_concurrent_runs_wait_for_each_other(executor: ToolExecutor) -> None:
    """One run at a time: a second thread's batch waits for the first instead of mixing."""
    outcomes: dict[str, list[str]] = {}

    def batch(tag: str) -> None:
        calls = [call("calculator", f"{tag}*{index}") for index in range(20)]
        outcomes[tag] = [r.observation for r in executor.run(calls)]

    threads = [threading.Thread(target=batch, args=(tag,)) for tag in ("3", "7")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert outcomes == {tag: [str(int(tag) * i) for i in range(20)] for tag in ("3", "7")}

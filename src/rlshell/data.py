"""Prompts and their reference answers: a generated arithmetic task, or a JSONL/Parquet file.

`load_dataset` is what runners call. ``data.task`` decides where prompts come
from, explicitly (a set ``train_path`` never switches the source silently):

- ``"arithmetic"``: `arithmetic_task`, sums of small numbers with a
  deterministic train/held-out split of a large prompt space;
- ``"file"``: `read_split` on ``data.train_path`` / ``data.val_path``: a
  ``.jsonl`` or ``.parquet`` file, or a folder or Hub dataset id
  (``openai/gsm8k/main``, `rlshell.hub`) whose split files are read; columns
  ``data.prompt_key`` and ``data.answer_key``; GSM8K's ``#### answer``
  convention is understood.

- ``"conversations"``: the sft runner's demonstrations, not prompts:
  `load_conversations` reads them (`rlshell.conversation.read_conversations`).
- ``"demonstrations"``: an embodied policy's sft run's recorded episodes, read by
  `rlshell.demonstrations.load_demonstrations`.

`PromptSampler` draws prompt batches in shuffled epochs (a `Sampler` of
prompts: the sft runner's draws conversations the same way); its
`SamplerState` goes into checkpoints so that a resumed run draws exactly the
prompts an uninterrupted run would have drawn.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from attrs import frozen

from rlshell.config import DataConfig
from rlshell.conversation import Message, read_conversations

__all__ = [
    "TASKS",
    "ArithmeticTask",
    "PromptExample",
    "PromptSampler",
    "Sampler",
    "SamplerState",
    "Split",
    "arithmetic_task",
    "gsm8k_answer",
    "load_conversations",
    "load_dataset",
    "load_prompts",
    "read_examples",
    "read_split",
    "render_chat",
    "write_jsonl",
]

Split = Literal["train", "val"]
TASKS = ("arithmetic", "file", "conversations", "demonstrations")
PROMPT_TASKS = ("arithmetic", "file")  # the tasks `load_dataset` reads prompts from
ExampleT = TypeVar("ExampleT")


@frozen
class PromptExample:
    """One prompt and the reference answer its response is scored against."""

    prompt: str
    answer: str


# ---------------------------------------------------------------------------
# Files


def gsm8k_answer(text: str) -> str:
    """The final answer of a GSM8K-style solution: the text after the last ``####``.

    Stripped, with thousands separators removed (``"1,000"`` → ``"1000"``).
    Text without ``####`` is returned stripped and otherwise unchanged.
    """
    if "####" not in text:
        return text.strip()
    final = text.rsplit("####", 1)[1].strip()
    return re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", final)


def read_examples(
    path: str | os.PathLike[str], prompt_key: str = "prompt", answer_key: str = "answer"
) -> list[PromptExample]:
    """The examples of a ``.jsonl`` (one JSON object per line) or ``.parquet`` file.

    Answers containing ``####`` are reduced to their final answer
    (`gsm8k_answer`); numeric answers become strings. Blank JSONL lines are
    skipped. Errors name the file, the line (JSONL) and the missing column
    with the columns present.
    """
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"{file}: no such data file")
    if file.suffix == ".jsonl":
        rows = _read_jsonl_rows(file, (prompt_key, answer_key))
    elif file.suffix == ".parquet":
        rows = _read_parquet_rows(file, (prompt_key, answer_key))
    else:
        raise ValueError(
            f"{file}: unsupported data file type {file.suffix!r}; use .jsonl or .parquet"
        )
    examples = [
        PromptExample(
            prompt=_text(row[prompt_key], where, prompt_key),
            answer=gsm8k_answer(_text(row[answer_key], where, answer_key)),
        )
        for where, row in rows
    ]
    if not examples:
        raise ValueError(f"{file}: no examples")
    return examples


def read_split(
    key: str, value: str, split: Split, prompt_key: str = "prompt", answer_key: str = "answer"
) -> list[PromptExample]:
    """The examples ``value`` gives ``split``: a ``.jsonl``/``.parquet`` file, or a folder or
    Hub dataset id (`rlshell.hub.data_files` picks the split's files, read in name order).
    ``key`` (``data.train_path``) names the setting in errors."""
    from rlshell.hub import data_files

    return [
        example
        for file in data_files(key, value, split)
        for example in read_examples(file, prompt_key, answer_key)
    ]


def write_jsonl(path: str | os.PathLike[str], examples: Iterable[PromptExample]) -> None:
    """Write ``{"prompt": ..., "answer": ...}`` lines that `read_examples` reads back."""
    file = Path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    with file.open("w", encoding="utf-8") as out:
        for example in examples:
            record = {"prompt": example.prompt, "answer": example.answer}
            out.write(json.dumps(record, ensure_ascii=False) + "\n")


def _read_jsonl_rows(file: Path, keys: tuple[str, str]) -> list[tuple[str, Mapping[str, Any]]]:
    rows: list[tuple[str, Mapping[str, Any]]] = []
    with file.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{file}:{number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{file}:{number}: invalid JSON ({error.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(
                    f"{file}:{number}: expected a JSON object, got {type(row).__name__}"
                )
            for key in keys:
                if key not in row:
                    raise ValueError(
                        f"{file}:{number}: no {key!r} key (keys present: {sorted(row)})"
                    )
            rows.append((where, row))
    return rows


def _read_parquet_rows(file: Path, keys: tuple[str, str]) -> list[tuple[str, Mapping[str, Any]]]:
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    table = pq.read_table(file)
    for key in keys:
        if key not in table.column_names:
            raise ValueError(f"{file}: no {key!r} column (columns present: {table.column_names})")
    records = table.select(list(dict.fromkeys(keys))).to_pylist()
    return [(f"{file}: row {index}", record) for index, record in enumerate(records)]


def _text(value: Any, where: str, key: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    raise ValueError(f"{where}: {key!r} must be a string, got {value!r}")


# ---------------------------------------------------------------------------
# The generated arithmetic task


@frozen
class ArithmeticTask:
    """Sums ``a₁+a₂+…+aₖ=`` (or, with ``operator="*"``, products ``a₁*a₂*…*aₖ=``) of
    ``num_terms`` integers in ``[0, max_operand]``.

    The prompt space has (max_operand + 1)^num_terms prompts. ``num_val``
    of them, drawn with ``seed``, are held out; training draws from the rest
    (all of them, or ``num_train`` drawn with the same seed).

    The default, three digits (1000 prompts, answers 0 … 27), is sized for a
    tiny model trained from scratch: with the character tokenizer a random
    model samples the right answer about 0.7% of the time, often enough for
    GRPO to start from, and the prompt space is large enough that held-out
    accuracy measures arithmetic rather than memorised prompts. Two digits
    (100 prompts) leave nothing to generalise to; two numbers up to 49 start
    from 0.3% and barely move in the same budget.

    Products of two numbers up to 999 (``operator="*"``) are the tool-use
    task (`configs/grpo_tool_agent.py`): six-digit answers a tiny model
    cannot work out in its few tokens, but can read off a calculator.
    """

    num_terms: int = 3
    max_operand: int = 9
    num_val: int = 200
    num_train: int | None = None
    seed: int = 0
    operator: Literal["+", "*"] = "+"
    phrasing: Literal["equation", "question", "word_problem"] = "equation"

    @classmethod
    def of(cls, data: DataConfig) -> ArithmeticTask:
        """The task ``data.num_terms``, ``max_operand``, ``num_val``, ``num_train`` and
        ``seed`` describe."""
        return cls(
            num_terms=data.num_terms,
            max_operand=data.max_operand,
            num_val=data.num_val,
            num_train=data.num_train,
            seed=data.seed,
            operator=data.operator,
            phrasing=data.phrasing,
        )

    @property
    def num_prompts(self) -> int:
        return int((self.max_operand + 1) ** self.num_terms)


def arithmetic_task(split: Split, task: ArithmeticTask | None = None) -> list[PromptExample]:
    """The ``split`` of a generated arithmetic task: prompts like ``"3+14="``, answers ``"17"``.

    Deterministic given ``task``. The held-out split depends only on the
    prompt space and ``task.seed`` (not on ``num_train``), and never shares a
    prompt with the training split.
    """
    task = ArithmeticTask() if task is None else task
    if task.num_terms < 1 or task.max_operand < 0:
        raise ValueError(
            f"arithmetic task: expected num_terms ≥ 1 and max_operand ≥ 0, "
            f"got num_terms={task.num_terms}, max_operand={task.max_operand}"
        )
    if task.phrasing == "word_problem" and (task.num_terms != 3 or task.operator != "+"):
        raise ValueError(
            "arithmetic task: word problems are a·b + c, three numbers (boxes of things and "
            f"some more): set num_terms=3 and leave operator '+', got num_terms="
            f"{task.num_terms}, operator={task.operator!r}"
        )
    size = task.num_prompts
    if not 0 <= task.num_val < size:
        raise ValueError(
            f"arithmetic task: num_val={task.num_val} must lie in [0, {size}), "
            f"the number of distinct prompts; raise max_operand or num_terms"
        )
    rng = random.Random(task.seed)
    held_out = rng.sample(range(size), task.num_val)
    if split == "val":
        indices = held_out
    elif split == "train":
        indices = _train_indices(task, set(held_out), rng)
    else:
        raise ValueError(f"unknown split {split!r}; expected 'train' or 'val'")
    return [_arithmetic_example(index, task) for index in indices]


def _train_indices(task: ArithmeticTask, held_out: set[int], rng: random.Random) -> list[int]:
    size = task.num_prompts
    available = size - len(held_out)
    if task.num_train is None:
        if size > 10_000_000:
            raise ValueError(f"arithmetic task: {size} prompts are too many to list; set num_train")
        return [index for index in range(size) if index not in held_out]
    if not 0 < task.num_train <= available:
        raise ValueError(
            f"arithmetic task: num_train={task.num_train} must lie in [1, {available}], "
            "the prompts left after the held-out split"
        )
    chosen: dict[int, None] = {}  # insertion-ordered set
    while len(chosen) < task.num_train:
        index = rng.randrange(size)
        if index not in held_out:
            chosen[index] = None
    return list(chosen)


def _arithmetic_example(index: int, task: ArithmeticTask) -> PromptExample:
    base = task.max_operand + 1
    operands = []
    for _ in range(task.num_terms):
        index, operand = divmod(index, base)
        operands.append(operand)
    if task.phrasing == "word_problem":
        return _word_problem(*operands)
    value = sum(operands) if task.operator == "+" else math.prod(operands)
    if task.phrasing == "question":
        prompt = f"What is {f' {task.operator} '.join(map(str, operands))}?"
        return PromptExample(prompt=prompt, answer=str(value))
    return PromptExample(prompt=task.operator.join(map(str, operands)) + "=", answer=str(value))


# Who and what a word problem is about, chosen by its numbers (a prompt is a function of
# its operands alone, so the split of the prompt space is the same as for the other phrasings).
_NAMES = ("Tom", "Anna", "Ravi", "Mei", "Lucas", "Sara", "Omar", "Ines", "Kofi", "Yuki")
_THINGS = (
    ("box", "pencils"),
    ("bag", "apples"),
    ("jar", "marbles"),
    ("crate", "books"),
    ("basket", "eggs"),
    ("pack", "cards"),
)


def _word_problem(boxes: int, each: int, more: int) -> PromptExample:
    """``boxes`` containers of ``each`` things, and ``more`` beside them: a·b + c."""
    name = _NAMES[(boxes * 7 + each * 3 + more) % len(_NAMES)]
    container, things = _THINGS[(boxes + each * 5 + more * 2) % len(_THINGS)]
    containers = container + ("es" if container.endswith("x") else "s")
    prompt = (
        f"{name} has {boxes} {containers if boxes != 1 else container} with {each} {things} "
        f"in each {container}, and {more} more {things} on the table. How many {things} does "
        f"{name} have in all?"
    )
    return PromptExample(prompt=prompt, answer=str(boxes * each + more))


def render_chat(
    examples: Sequence[PromptExample],
    tokenizer: Any,
    system_prompt: str | None = None,
    few_shot: Sequence[tuple[str, str]] = (),
) -> list[PromptExample]:
    """``examples`` with each prompt made the user's turn of a conversation, rendered by the
    tokenizer's own chat template up to the assistant's turn (``add_generation_prompt``):
    after a system turn of ``system_prompt`` when given, and the ``few_shot`` turns
    (``(role, text)`` pairs) after it. Answers are unchanged. Raises ValueError when the
    tokenizer has no chat template."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "data.chat_template: the model's tokenizer has no chat template (the character "
            "tokenizer of models built here has none); leave data.chat_template false"
        )
    system = [] if system_prompt is None else [{"role": "system", "content": system_prompt}]
    system += [{"role": role, "content": text} for role, text in few_shot]
    return [
        PromptExample(
            prompt=str(
                tokenizer.apply_chat_template(
                    [*system, {"role": "user", "content": example.prompt}],
                    tokenize=False,
                    add_generation_prompt=True,
                )
            ),
            answer=example.answer,
        )
        for example in examples
    ]


# ---------------------------------------------------------------------------
# Sampling


@frozen
class SamplerState:
    """Where a `PromptSampler` stands: the epoch and the position within its order."""

    epoch: int = 0
    position: int = 0


class Sampler(Generic[ExampleT]):
    """Batches of ``batch_size`` examples in shuffled epochs, deterministic given ``seed``.

    Each epoch visits every example once, in an order that depends only on
    ``seed`` and the epoch number; a batch that reaches the end of an epoch
    continues into the next. `state` and `load_state` let a resumed run draw
    the same batches as an uninterrupted one. The order depends on the number of
    examples, not on what they are.
    """

    def __init__(self, examples: Sequence[ExampleT], batch_size: int, seed: int = 0) -> None:
        if not examples:
            raise ValueError(f"{type(self).__name__} needs at least one example")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self._examples = list(examples)
        self._batch_size = batch_size
        self._seed = seed
        self._epoch = 0
        self._position = 0
        self._order = self._epoch_order(0)

    def next(self) -> list[ExampleT]:
        """The next ``batch_size`` examples."""
        batch: list[ExampleT] = []
        while len(batch) < self._batch_size:
            if self._position == len(self._order):
                self._epoch += 1
                self._position = 0
                self._order = self._epoch_order(self._epoch)
            take = min(self._batch_size - len(batch), len(self._order) - self._position)
            batch.extend(
                self._examples[i] for i in self._order[self._position : self._position + take]
            )
            self._position += take
        return batch

    def state(self) -> SamplerState:
        return SamplerState(epoch=self._epoch, position=self._position)

    def load_state(self, state: SamplerState) -> None:
        """Continue from ``state`` (taken from a sampler over the same examples and seed)."""
        if state.epoch < 0 or not 0 <= state.position <= len(self._examples):
            raise ValueError(
                f"sampler state {state} does not fit {len(self._examples)} examples: "
                "expected epoch ≥ 0 and position in [0, number of examples]"
            )
        self._epoch = state.epoch
        self._position = state.position
        self._order = self._epoch_order(state.epoch)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self._examples)))
        # A string seed is hashed with SHA-512: the same order on every Python run.
        random.Random(f"prompt-sampler/{self._seed}/{epoch}").shuffle(order)
        return order


class PromptSampler(Sampler[PromptExample]):
    """Prompt batches of ``batch_size`` in shuffled epochs (`Sampler`)."""


# ---------------------------------------------------------------------------
# Dispatch


def load_dataset(
    cfg: DataConfig, split: Split, arithmetic: ArithmeticTask | None = None
) -> list[PromptExample]:
    """The ``split`` examples that ``cfg`` names.

    ``cfg.task == "arithmetic"``: `arithmetic_task` with ``arithmetic`` (the
    task ``cfg`` describes, `ArithmeticTask.of`, when None); ``train_path`` and
    ``val_path`` must then be unset.
    ``cfg.task == "file"``: `read_split` on ``train_path`` (required) or
    ``val_path`` (optional: without it the val split is empty).
    ``cfg.instruction``, when set, follows each prompt after a space.
    """
    examples = _examples(cfg, split, arithmetic)
    if cfg.instruction is None:
        return examples
    return [PromptExample(f"{e.prompt} {cfg.instruction}", e.answer) for e in examples]


def _examples(
    cfg: DataConfig, split: Split, arithmetic: ArithmeticTask | None
) -> list[PromptExample]:
    if cfg.task == "arithmetic":
        for key, value in (("train_path", cfg.train_path), ("val_path", cfg.val_path)):
            if value is not None:
                raise ValueError(
                    f"data.{key} is set ({value!r}) but data.task is 'arithmetic', which "
                    "generates its prompts; set data.task='file' to read files"
                )
        return arithmetic_task(split, ArithmeticTask.of(cfg) if arithmetic is None else arithmetic)
    if cfg.task == "file":
        path = cfg.train_path if split == "train" else cfg.val_path
        if path is None:
            if split == "val":
                return []
            raise ValueError(
                "data.train_path: expected a .jsonl or .parquet file for data.task='file'"
            )
        return read_split(f"data.{split}_path", path, split, cfg.prompt_key, cfg.answer_key)
    if cfg.task in ("conversations", "demonstrations"):
        raise ValueError(
            f"data.task: '{cfg.task}' are demonstrations for runner.runner_type='sft' "
            "(load_conversations, rlshell.demonstrations), not prompts with answers"
        )
    raise ValueError(f"data.task: unknown task {cfg.task!r}; expected one of {list(PROMPT_TASKS)}")


def load_prompts(
    cfg: DataConfig, split: Split, tokenizer: Callable[[], Any]
) -> list[PromptExample]:
    """`load_dataset`'s ``split`` as the model reads it: with ``data.chat_template``, each
    prompt rendered by the model's chat template (`render_chat`, after
    ``data.system_prompt`` and ``data.few_shot``); ``tokenizer`` is called for the tokenizer
    only then."""
    examples = load_dataset(cfg, split)
    if not cfg.chat_template or not examples:
        return examples
    return render_chat(examples, tokenizer(), cfg.system_prompt, cfg.few_shot)


def load_conversations(cfg: DataConfig, split: Split) -> list[list[Message]]:
    """The ``split`` conversations of ``data.task='conversations'``: ``train_path``
    (required) or ``val_path`` (without it the val split is empty), JSONL files of
    ``{"messages": [...]}`` (`rlshell.conversation.read_conversations`)."""
    if cfg.task != "conversations":
        raise ValueError(
            f"data.task is '{cfg.task}': conversations are read with data.task='conversations'"
        )
    path = cfg.train_path if split == "train" else cfg.val_path
    if path is None:
        if split == "val":
            return []
        raise ValueError(
            "data.train_path: expected a .jsonl file of conversations for data.task='conversations'"
        )
    if not Path(path).is_file():
        raise FileNotFoundError(f"data.{split}_path: {path} is not a file")
    return read_conversations(path)

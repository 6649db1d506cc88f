"""Prompt data: file reading and its errors, GSM8K answers, the arithmetic task, the sampler."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlshell.config import DataConfig
from rlshell.data import (
    ArithmeticTask,
    PromptExample,
    PromptSampler,
    SamplerState,
    arithmetic_task,
    gsm8k_answer,
    load_dataset,
    load_prompts,
    read_examples,
    render_chat,
    write_jsonl,
)

EXAMPLES = [PromptExample(f"{i}+1=", str(i + 1)) for i in range(10)]


# ---------------------------------------------------------------------------
# Files


def test_jsonl_round_trips(tmp_path: Path) -> None:
    examples = [*EXAMPLES, PromptExample('Ünïcode "quoted"\nline?', "x")]
    write_jsonl(tmp_path / "sub" / "data.jsonl", examples)
    assert read_examples(tmp_path / "sub" / "data.jsonl") == examples


def test_jsonl_with_other_keys_numbers_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text(
        '{"question": "q1", "solution": 3, "extra": 1}\n\n{"question": "q2", "solution": "4"}\n'
    )
    examples = read_examples(path, prompt_key="question", answer_key="solution")
    assert examples == [PromptExample("q1", "3"), PromptExample("q2", "4")]


def test_bad_json_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "b", "answer": \n')
    with pytest.raises(ValueError, match=r"data\.jsonl:2: invalid JSON"):
        read_examples(path)


def test_missing_jsonl_key_names_line_and_keys_present(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "b", "solution": "2"}\n')
    with pytest.raises(
        ValueError,
        match=r"data\.jsonl:2: no 'answer' key \(keys present: \['prompt', 'solution'\]\)",
    ):
        read_examples(path)


def test_jsonl_line_that_is_not_an_object(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match=r"data\.jsonl:1: expected a JSON object, got list"):
        read_examples(path)


def test_parquet_is_read_with_gsm8k_answers(tmp_path: Path) -> None:
    path = tmp_path / "gsm8k.parquet"
    table = pa.table(
        {
            "question": ["How many?", "How much?"],
            "answer": ["3 + 4 = <<3+4=7>>7\n#### 7", "Lots.\n#### 1,000"],
            "id": [1, 2],
        }
    )
    pq.write_table(table, path)
    examples = read_examples(path, prompt_key="question")
    assert examples == [PromptExample("How many?", "7"), PromptExample("How much?", "1000")]


def test_missing_parquet_column_names_file_and_columns_present(tmp_path: Path) -> None:
    path = tmp_path / "data.parquet"
    pq.write_table(pa.table({"question": ["q"], "answer": ["1"]}), path)
    with pytest.raises(
        ValueError,
        match=r"data\.parquet: no 'prompt' column \(columns present: \['question', 'answer'\]\)",
    ):
        read_examples(path)


def test_non_string_value_is_named(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text('{"prompt": ["a"], "answer": "1"}\n')
    with pytest.raises(ValueError, match=r"data\.jsonl:1: 'prompt' must be a string"):
        read_examples(path)


def test_missing_file_empty_file_and_unknown_suffix(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl"):
        read_examples(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="no examples"):
        read_examples(tmp_path / "empty.jsonl")
    (tmp_path / "data.csv").write_text("prompt,answer\n")
    with pytest.raises(ValueError, match=r"unsupported data file type '\.csv'"):
        read_examples(tmp_path / "data.csv")


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("She has 3 + 4 = 7 apples.\n#### 7", "7"),
        ("#### 1,000", "1000"),
        ("#### 1,234,567.5", "1234567.5"),
        ("a #### 2 #### -12 ", "-12"),
        ("(3, 4)", "(3, 4)"),
        ("  42 ", "42"),
        ("#### 12,34", "12,34"),
    ],
)
def test_gsm8k_answer(text: str, answer: str) -> None:
    assert gsm8k_answer(text) == answer


# ---------------------------------------------------------------------------
# The arithmetic task


def test_arithmetic_examples_are_correct_sums() -> None:
    task = ArithmeticTask(num_terms=3, max_operand=9, num_val=50)
    for example in arithmetic_task("train", task) + arithmetic_task("val", task):
        assert example.prompt.endswith("=")
        terms = example.prompt[:-1].split("+")
        assert len(terms) == 3
        assert all(0 <= int(t) <= 9 for t in terms)
        assert int(example.answer) == sum(map(int, terms))


@given(
    num_terms=st.integers(1, 3),
    max_operand=st.integers(3, 30),
    seed=st.integers(0, 2**32),
    data=st.data(),
)
def test_splits_are_disjoint_deterministic_and_cover_the_space(
    num_terms: int, max_operand: int, seed: int, data: st.DataObject
) -> None:
    size = (max_operand + 1) ** num_terms
    num_val = data.draw(st.integers(0, size - 1))
    task = ArithmeticTask(num_terms=num_terms, max_operand=max_operand, num_val=num_val, seed=seed)
    train, val = arithmetic_task("train", task), arithmetic_task("val", task)
    train_prompts = {e.prompt for e in train}
    val_prompts = {e.prompt for e in val}
    assert len(train_prompts) == len(train)
    assert len(val_prompts) == len(val) == num_val
    assert not train_prompts & val_prompts
    assert len(train) + len(val) == size
    assert arithmetic_task("train", task) == train
    assert arithmetic_task("val", task) == val


def test_held_out_split_does_not_depend_on_num_train() -> None:
    task = ArithmeticTask(num_terms=2, max_operand=99, num_val=300, seed=7)
    sampled = ArithmeticTask(num_terms=2, max_operand=99, num_val=300, seed=7, num_train=1000)
    val = arithmetic_task("val", task)
    assert arithmetic_task("val", sampled) == val
    train = arithmetic_task("train", sampled)
    assert len({e.prompt for e in train}) == 1000
    assert not {e.prompt for e in train} & {e.prompt for e in val}
    assert arithmetic_task("train", sampled) == train
    other_seed = ArithmeticTask(num_terms=2, max_operand=99, num_val=300, seed=8)
    assert arithmetic_task("val", other_seed) != val


def test_default_task_has_a_large_prompt_space() -> None:
    task = ArithmeticTask()
    assert task.num_prompts >= 1000
    assert len(arithmetic_task("val", task)) == task.num_val


@given(
    phrasing=st.sampled_from(["equation", "question", "word_problem"]),
    max_operand=st.integers(2, 12),
    seed=st.integers(0, 2**32),
)
def test_every_phrasing_splits_the_same_prompt_space_and_states_its_answer(
    phrasing: str, max_operand: int, seed: int
) -> None:
    """A phrasing changes the words, never which operands are held out: the split is by the
    prompt's index, and each prompt's answer is what its numbers give."""
    task = ArithmeticTask(num_terms=3, max_operand=max_operand, num_val=20, seed=seed)
    phrased = ArithmeticTask(
        num_terms=3, max_operand=max_operand, num_val=20, seed=seed, phrasing=phrasing
    )  # type: ignore[arg-type]
    for split in ("train", "val"):
        plain, worded = arithmetic_task(split, task), arithmetic_task(split, phrased)
        assert len(plain) == len(worded)
        for equation, example in zip(plain, worded, strict=True):
            numbers = [int(n) for n in re.findall(r"\d+", example.prompt)]
            a, b, c = (int(t) for t in equation.prompt.rstrip("=").split("+"))
            if phrasing == "word_problem":
                assert numbers == [a, b, c]
                assert example.answer == str(a * b + c)
                assert example.prompt.endswith("have in all?")
            else:
                assert numbers == [a, b, c]
                assert example.answer == equation.answer == str(a + b + c)
    train = {e.prompt for e in arithmetic_task("train", phrased)}
    assert not train & {e.prompt for e in arithmetic_task("val", phrased)}


def test_questions_and_word_problems_read_as_written() -> None:
    question = ArithmeticTask(num_terms=2, max_operand=30, num_val=1, phrasing="question")
    assert re.fullmatch(r"What is \d+ \+ \d+\?", arithmetic_task("val", question)[0].prompt)
    product = ArithmeticTask(num_terms=2, num_val=1, phrasing="question", operator="*")
    example = arithmetic_task("val", product)[0]
    a, b = (int(n) for n in re.findall(r"\d+", example.prompt))
    assert re.fullmatch(r"What is \d+ \* \d+\?", example.prompt)
    assert example.answer == str(a * b)
    word = ArithmeticTask(num_terms=3, max_operand=9, num_val=1, phrasing="word_problem")
    assert re.fullmatch(
        r"\w+ has \d+ \w+ with \d+ (\w+) in each \w+, and \d+ more \1 on the table\. "
        r"How many \1 does \w+ have in all\?",
        arithmetic_task("val", word)[0].prompt,
    )


def test_an_instruction_follows_every_prompt(tmp_path: Path) -> None:
    generated = DataConfig(num_val=3, phrasing="question", instruction="Number only.")
    for example, plain in zip(
        load_dataset(generated, "val"),
        arithmetic_task("val", ArithmeticTask(num_val=3, phrasing="question")),
        strict=True,
    ):
        assert example == PromptExample(f"{plain.prompt} Number only.", plain.answer)
    write_jsonl(tmp_path / "d.jsonl", [PromptExample("2+2?", "4")])
    read = DataConfig(task="file", train_path=str(tmp_path / "d.jsonl"), instruction="Be brief.")
    assert load_dataset(read, "train") == [PromptExample("2+2? Be brief.", "4")]


class ChatTokenizer:
    """A tokenizer's chat-template interface, rendering ChatML as SmolLM2's template does."""

    chat_template = "chatml"

    def apply_chat_template(
        self, messages: list[dict[str, str]], tokenize: bool, add_generation_prompt: bool
    ) -> str:
        assert tokenize is False
        assert add_generation_prompt is True
        turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return turns + "<|im_start|>assistant\n"


def test_prompts_are_rendered_by_the_chat_template_with_the_system_prompt() -> None:
    examples = [PromptExample("What is 2 + 3?", "5")]
    assert render_chat(examples, ChatTokenizer()) == [
        PromptExample("<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n", "5")
    ]
    (rendered,) = render_chat(examples, ChatTokenizer(), "Be brief.")
    assert rendered.prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user")
    calls: list[int] = []

    def tokenizer() -> ChatTokenizer:
        calls.append(1)
        return ChatTokenizer()

    plain = DataConfig(num_val=2, phrasing="question")
    assert load_prompts(plain, "val", tokenizer) == load_dataset(plain, "val")
    assert not calls  # the tokenizer is loaded only to render
    chat = DataConfig(num_val=2, phrasing="question", chat_template=True, system_prompt="Hi.")
    assert load_prompts(chat, "val", tokenizer) == render_chat(
        load_dataset(plain, "val"), ChatTokenizer(), "Hi."
    )


def test_few_shot_turns_come_between_the_system_turn_and_each_prompt() -> None:
    shots = (
        ("user", "What is 12 + 9?"),
        ("assistant", "<call>12 + 9</call>"),
        ("tool", "21"),
        ("assistant", "21"),
    )
    (rendered,) = render_chat(
        [PromptExample("What is 2 + 3?", "5")], ChatTokenizer(), "Calc.", shots
    )
    assert rendered == PromptExample(
        "<|im_start|>system\nCalc.<|im_end|>\n<|im_start|>user\nWhat is 12 + 9?<|im_end|>\n"
        "<|im_start|>assistant\n<call>12 + 9</call><|im_end|>\n<|im_start|>tool\n21<|im_end|>\n"
        "<|im_start|>assistant\n21<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
        "<|im_start|>assistant\n",
        "5",
    )
    chat = DataConfig(num_val=2, phrasing="question", chat_template=True, few_shot=shots)
    plain = DataConfig(num_val=2, phrasing="question")
    assert load_prompts(chat, "val", ChatTokenizer) == render_chat(
        load_dataset(plain, "val"), ChatTokenizer(), None, shots
    )


def test_a_tokenizer_without_a_chat_template_is_refused() -> None:
    from rlshell.tokenizer import build_char_tokenizer

    with pytest.raises(ValueError, match=r"data\.chat_template: the model.s tokenizer has no chat"):
        render_chat([PromptExample("1+1=", "2")], build_char_tokenizer())


@pytest.mark.parametrize(
    ("task", "message"),
    [
        (
            ArithmeticTask(num_terms=2, max_operand=9, num_val=10, phrasing="word_problem"),
            r"word problems are a·b \+ c, three numbers .*num_terms=2",
        ),
        (
            ArithmeticTask(num_terms=2, max_operand=9, num_val=100),
            r"num_val=100 must lie in \[0, 100\)",
        ),
        (ArithmeticTask(num_terms=0), "num_terms"),
        (ArithmeticTask(num_terms=2, max_operand=9, num_val=10, num_train=91), r"num_train=91"),
    ],
)
def test_impossible_tasks_are_refused(task: ArithmeticTask, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        arithmetic_task("train", task)


# ---------------------------------------------------------------------------
# The sampler


def draw(sampler: PromptSampler, batches: int) -> list[list[str]]:
    return [[e.prompt for e in sampler.next()] for _ in range(batches)]


def flat(batches: list[list[str]]) -> list[str]:
    return [prompt for batch in batches for prompt in batch]


def test_epochs_visit_every_example_once_in_a_fresh_order() -> None:
    sampler = PromptSampler(EXAMPLES, batch_size=5, seed=0)
    first, second = flat(draw(sampler, 2)), flat(draw(sampler, 2))
    assert sorted(first) == sorted(second) == sorted(e.prompt for e in EXAMPLES)
    assert first != second
    assert sampler.state() == SamplerState(epoch=1, position=10)


def test_sampler_is_deterministic_given_its_seed() -> None:
    assert draw(PromptSampler(EXAMPLES, 3, seed=1), 7) == draw(
        PromptSampler(EXAMPLES, 3, seed=1), 7
    )
    assert draw(PromptSampler(EXAMPLES, 3, seed=1), 7) != draw(
        PromptSampler(EXAMPLES, 3, seed=2), 7
    )


def test_batches_larger_than_an_epoch_span_epochs() -> None:
    sampler = PromptSampler(EXAMPLES[:3], batch_size=7, seed=0)
    batch = sampler.next()
    assert len(batch) == 7
    assert sampler.state() == SamplerState(epoch=2, position=1)


@given(
    batch_size=st.integers(1, 12),
    before=st.integers(0, 15),
    after=st.integers(1, 15),
    seed=st.integers(0, 100),
)
def test_resuming_from_state_draws_what_an_uninterrupted_run_draws(
    batch_size: int, before: int, after: int, seed: int
) -> None:
    uninterrupted = PromptSampler(EXAMPLES, batch_size, seed)
    draw(uninterrupted, before)
    expected = draw(uninterrupted, after)

    interrupted = PromptSampler(EXAMPLES, batch_size, seed)
    draw(interrupted, before)
    state = interrupted.state()
    resumed = PromptSampler(EXAMPLES, batch_size, seed)
    resumed.load_state(state)
    assert draw(resumed, after) == expected


def test_bad_sampler_arguments_and_states() -> None:
    with pytest.raises(ValueError, match="at least one example"):
        PromptSampler([], batch_size=1)
    with pytest.raises(ValueError, match="batch_size"):
        PromptSampler(EXAMPLES, batch_size=0)
    sampler = PromptSampler(EXAMPLES, batch_size=2)
    with pytest.raises(ValueError, match="does not fit 10 examples"):
        sampler.load_state(SamplerState(epoch=0, position=11))


# ---------------------------------------------------------------------------
# Dispatch


def test_load_dataset_generates_the_arithmetic_task() -> None:
    task = ArithmeticTask(num_terms=2, max_operand=20, num_val=30)
    assert load_dataset(DataConfig(), "val", task) == arithmetic_task("val", task)
    assert load_dataset(DataConfig(), "train") == arithmetic_task("train")


def test_load_dataset_reads_files(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "train.jsonl", EXAMPLES[:6])
    rows = [{"prompt": e.prompt, "answer": e.answer} for e in EXAMPLES[6:]]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "val.parquet")
    cfg = DataConfig(
        task="file",
        train_path=str(tmp_path / "train.jsonl"),
        val_path=str(tmp_path / "val.parquet"),
    )
    assert load_dataset(cfg, "train") == EXAMPLES[:6]
    assert load_dataset(cfg, "val") == EXAMPLES[6:]
    # Without a val_path there is no held-out split.
    assert load_dataset(DataConfig(task="file", train_path=cfg.train_path), "val") == []


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (DataConfig(task="file"), "data.train_path: expected a .jsonl or .parquet"),
        (DataConfig(train_path="x.jsonl"), "data.train_path is set .* data.task is 'arithmetic'"),
        (
            DataConfig(task="gsm9k"),
            r"data.task: unknown task 'gsm9k'; expected one of \['arithmetic', 'file'\]",
        ),
    ],
)
def test_load_dataset_errors_name_the_config_key(cfg: DataConfig, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_dataset(cfg, "train")


def test_written_jsonl_is_one_object_per_line(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "d.jsonl", EXAMPLES[:2])
    lines = (tmp_path / "d.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"prompt": "0+1=", "answer": "1"},
        {"prompt": "1+1=", "answer": "2"},
    ]

"""The character tokenizer: lossless round trips, fixed special ids, save and load."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from transformers import PreTrainedTokenizerBase

from rlshell.tokenizer import (
    DEFAULT_ALPHABET,
    SPECIAL_TOKENS,
    build_char_tokenizer,
    ensure_tokenizer,
    load_tokenizer,
)

TOKENIZER = build_char_tokenizer()


@given(st.text(alphabet=DEFAULT_ALPHABET, max_size=40))
def test_decode_inverts_encode_over_the_alphabet(text: str) -> None:
    ids = TOKENIZER(text)["input_ids"]
    assert len(ids) == len(text)  # one token per character, no special token added
    assert TOKENIZER.decode(ids) == text


@given(st.text(alphabet="ab\n\t +=", min_size=1, max_size=20))
def test_any_alphabet_round_trips_whitespace(text: str) -> None:
    tokenizer = build_char_tokenizer("ab\n\t +=")
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


def test_special_tokens_have_fixed_ids_and_characters_follow() -> None:
    assert SPECIAL_TOKENS == ("<pad>", "<bos>", "<eos>", "<unk>")
    assert (TOKENIZER.pad_token_id, TOKENIZER.bos_token_id) == (0, 1)
    assert (TOKENIZER.eos_token_id, TOKENIZER.unk_token_id) == (2, 3)
    assert len(TOKENIZER) == len(SPECIAL_TOKENS) + len(DEFAULT_ALPHABET)
    assert TOKENIZER("0")["input_ids"] == [4]
    assert TOKENIZER.convert_ids_to_tokens([4, 14, 15, 16]) == ["0", "+", "=", " "]


def test_unknown_characters_become_unk_and_specials_can_be_skipped() -> None:
    ids = TOKENIZER("7x")["input_ids"]
    assert ids == [11, TOKENIZER.unk_token_id]
    assert TOKENIZER.decode([11, TOKENIZER.eos_token_id, 0, 0], skip_special_tokens=True) == "7"


def test_batches_are_padded_on_the_left() -> None:
    batch = TOKENIZER(["1+2=", "10+20="], padding=True)
    assert batch["input_ids"][0][:2] == [TOKENIZER.pad_token_id] * 2
    assert batch["attention_mask"] == [[0, 0, 1, 1, 1, 1], [1] * 6]


@pytest.mark.parametrize(("alphabet", "message"), [("", "empty"), ("0120", "repeats")])
def test_bad_alphabets_are_refused(alphabet: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_char_tokenizer(alphabet)


def test_save_and_load_through_auto_tokenizer(tmp_path: Path) -> None:
    TOKENIZER.save_pretrained(tmp_path)
    loaded = load_tokenizer(tmp_path)
    assert isinstance(loaded, PreTrainedTokenizerBase)
    assert loaded.get_vocab() == TOKENIZER.get_vocab()
    assert loaded.padding_side == "left"
    assert (loaded.pad_token_id, loaded.eos_token_id) == (0, 2)
    text = "12+ 3=15 "
    assert loaded(text)["input_ids"] == TOKENIZER(text)["input_ids"]
    assert loaded.decode(loaded(text)["input_ids"]) == text


def test_load_names_the_path_that_is_not_a_tokenizer(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "missing")):
        load_tokenizer(tmp_path / "missing")


def test_ensure_builds_once_then_loads(tmp_path: Path) -> None:
    directory = tmp_path / "tok"
    first = ensure_tokenizer(directory)
    assert (directory / "tokenizer.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["tok"]  # no staging directory left
    written = (directory / "tokenizer.json").stat().st_mtime_ns
    second = ensure_tokenizer(directory)
    assert (directory / "tokenizer.json").stat().st_mtime_ns == written
    assert second.get_vocab() == first.get_vocab()


def test_ensure_refuses_a_tokenizer_of_another_alphabet(tmp_path: Path) -> None:
    ensure_tokenizer(tmp_path / "tok", alphabet="01")
    with pytest.raises(ValueError, match="not built from the alphabet"):
        ensure_tokenizer(tmp_path / "tok")

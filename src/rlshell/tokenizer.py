"""The project's own character-level tokenizer, for models built from scratch.

One token per character of a small alphabet, plus four special tokens with
fixed ids: ``<pad>`` 0, ``<bos>`` 1, ``<eos>`` 2, ``<unk>`` 3. A small
vocabulary is what gives a randomly initialised model a measurable chance of
sampling the right answer to the generated arithmetic task
(`rlshell.data.arithmetic_task`). Encoding adds no special tokens, and
``decode(encode(text)) == text`` for any text over the alphabet, spaces
included; characters outside it become ``<unk>``.

The tokenizer is a ``tokenizers.Tokenizer`` (word-level model over single
characters) wrapped as a ``transformers.PreTrainedTokenizerFast`` that pads on
the left, as batched generation needs. It is saved with ``save_pretrained``
and read back with ``AutoTokenizer.from_pretrained(dir, local_files_only=True)``,
so rollout and training processes load the same files. Models read from a
local directory or a Hub id use their own tokenizer instead (`load_tokenizer`
reads either).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from attrs import evolve
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from rlshell.config import Config, ConfigError

__all__ = [
    "BOS_TOKEN",
    "DEFAULT_ALPHABET",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "SPECIAL_TOKENS",
    "UNK_TOKEN",
    "build_char_tokenizer",
    "ensure_tokenizer",
    "load_tokenizer",
    "prepare_tokenizer",
    "with_tokenizer_ids",
]

# Digits, the sum's operator, '=' ending a prompt, and a space: what the
# arithmetic task's prompts and answers are written in.
DEFAULT_ALPHABET = "0123456789+= "

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
# Ids 0 … 3, in this order; the alphabet's characters follow from id 4.
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)


def build_char_tokenizer(alphabet: str = DEFAULT_ALPHABET) -> PreTrainedTokenizerFast:
    """A tokenizer with one token per character of ``alphabet``, after the special tokens.

    Character i of ``alphabet`` gets id ``len(SPECIAL_TOKENS) + i``. The
    alphabet must be non-empty and must not repeat a character.
    """
    if not alphabet:
        raise ValueError("alphabet is empty: a tokenizer needs at least one character")
    repeated = sorted({c for c in alphabet if alphabet.count(c) > 1})
    if repeated:
        raise ValueError(f"alphabet repeats the characters {repeated!r}: list each once")
    vocab = {token: index for index, token in enumerate((*SPECIAL_TOKENS, *alphabet))}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # Every character is its own pre-token (newlines too: [\s\S], not '.');
    # Fuse joins the decoded tokens back with nothing between them.
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


def load_tokenizer(path: str | os.PathLike[str]) -> PreTrainedTokenizerBase:
    """The tokenizer saved in directory ``path``, or of the Hub id ``path`` (`rlshell.hub`:
    read through the Hub cache; downloaded only without ``HF_HUB_OFFLINE``)."""
    from rlshell.hub import hub_id, pretrained_source

    if hub_id(str(path)) is not None:
        source, options = pretrained_source(str(path))
        loaded: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(source, **options)
        return loaded
    directory = Path(path)
    if not (directory / "tokenizer_config.json").is_file():
        raise FileNotFoundError(
            f"{directory} is not a tokenizer directory (no tokenizer_config.json there); "
            "save one with build_char_tokenizer(...).save_pretrained(dir) or ensure_tokenizer"
        )
    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(
        directory, local_files_only=True
    )
    return tokenizer


def ensure_tokenizer(
    path: str | os.PathLike[str], alphabet: str = DEFAULT_ALPHABET
) -> PreTrainedTokenizerBase:
    """The character tokenizer saved at ``path``, built and saved there first if absent.

    Several processes may call this at once: the tokenizer is written to a
    temporary directory beside ``path`` and renamed into place, so a reader
    never sees half-written files. A tokenizer found at ``path`` must have
    been built from the same ``alphabet``.
    """
    directory = Path(path)
    if not (directory / "tokenizer_config.json").is_file():
        directory.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
        build_char_tokenizer(alphabet).save_pretrained(staging)
        try:
            staging.rename(directory)
        except OSError:
            # Another process renamed its copy into place first (or the directory
            # exists without a tokenizer, which load_tokenizer reports below).
            shutil.rmtree(staging, ignore_errors=True)
    tokenizer = load_tokenizer(directory)
    expected = build_char_tokenizer(alphabet).get_vocab()
    if tokenizer.get_vocab() != expected:
        raise ValueError(
            f"the tokenizer at {directory} was not built from the alphabet {alphabet!r} "
            f"(vocabulary of {len(tokenizer)} tokens, expected {len(expected)}); "
            "delete the directory or pass its alphabet"
        )
    return tokenizer


def prepare_tokenizer(config: Config, run_dir: Path) -> str:
    """The tokenizer of a run, as every process loads it (`load_tokenizer`): the given one,
    the model's own (a local directory or a Hub id), or the project's, built here."""
    model = config.actor.model
    if model.tokenizer_path is not None:
        source = model.tokenizer_path
    elif model.path is not None:
        source = model.path
    else:
        path = run_dir / "tokenizer"
        ensure_tokenizer(path)
        return str(path)
    load_tokenizer(source)  # a clear error now, not in every worker
    return source


def with_tokenizer_ids(config: Config, tokenizer_dir: str | os.PathLike[str]) -> Config:
    """For a model built from ``model_kwargs``: vocabulary size and special ids from the tokenizer.

    An explicit ``vocab_size`` smaller than the tokenizer's vocabulary is an
    error (tokens would index past the embedding).
    """
    model = config.actor.model
    if model.path is not None:
        return config
    tokenizer = load_tokenizer(tokenizer_dir)
    size = len(tokenizer)
    kwargs = dict(model.model_kwargs)
    given = kwargs.get("vocab_size")
    if given is not None and int(given) < size:
        raise ConfigError(
            [
                f"actor.model.model_kwargs.vocab_size: {given} is smaller than the tokenizer's "
                f"{size} tokens ({tokenizer_dir}); remove it to use the tokenizer's size"
            ]
        )
    kwargs.setdefault("vocab_size", size)
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        value = getattr(tokenizer, key)
        if value is not None:
            kwargs.setdefault(key, int(value))
    actor = evolve(config.actor, model=evolve(model, model_kwargs=kwargs))
    return evolve(config, actor=actor)

"""The project's own character-level tokenizer, for models built from scratch.

One token per character of a small alphabet, plus four special tokens with
fixed ids: ``<pad>`` 0, ``<bos>`` 1, ``<eos>`` 2, ``<unk>`` 3. A small
vocabulary is what gives a randomly initialised model a measurable chance of
sampling the right answer to the generated arithmetic task
(`rlshell.data.arithmetic_task`). Encoding adds no special tokens, and
``decode(encode(text)) == text`` for any text over the alphabet, spaces
included; characters outside it become ``<unk>``. Extra tokens of several
characters (the agent's markers, ``<call>`` …) come after the alphabet: each
occurrence in a text is one token, and decodes back to its text.

`prepare_tokenizer` builds a run's: `DEFAULT_ALPHABET` plus every other
character the run's text uses (`run_alphabet`), and the four agent markers
as extra tokens in runs that use them (`agent_markers`). The default run's
tokenizer is `DEFAULT_ALPHABET`'s alone.

The tokenizer is a ``tokenizers.Tokenizer`` (word-level model over single
characters) wrapped as a ``transformers.PreTrainedTokenizerFast`` that pads on
the left, as batched generation needs. It is saved with ``save_pretrained``
and read back with ``AutoTokenizer.from_pretrained(dir, local_files_only=True)``,
so rollout and training processes load the same files. Models read from a
local directory or a Hub id use their own tokenizer instead (`load_tokenizer`
reads either).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Sequence
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
    "agent_markers",
    "build_char_tokenizer",
    "ensure_tokenizer",
    "load_tokenizer",
    "prepare_tokenizer",
    "run_alphabet",
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


def build_char_tokenizer(
    alphabet: str = DEFAULT_ALPHABET, extra_tokens: Sequence[str] = ()
) -> PreTrainedTokenizerFast:
    """A tokenizer with one token per character of ``alphabet``, after the special tokens,
    then one per string of ``extra_tokens``.

    Character i of ``alphabet`` gets id ``len(SPECIAL_TOKENS) + i``; extra token j
    the id ``len(SPECIAL_TOKENS) + len(alphabet) + j``. Extra tokens are matched
    before the text is split into characters (the longest first, where one begins
    another) and are not special: ``decode`` keeps them. The alphabet must be
    non-empty and must not repeat a character; an extra token must have two
    characters or more and appear once.
    """
    if not alphabet:
        raise ValueError("alphabet is empty: a tokenizer needs at least one character")
    repeated = sorted({c for c in alphabet if alphabet.count(c) > 1})
    if repeated:
        raise ValueError(f"alphabet repeats the characters {repeated!r}: list each once")
    extras = list(extra_tokens)
    short = [token for token in extras if len(token) < 2]
    if short:
        raise ValueError(
            f"extra tokens {short!r} are shorter than two characters: a character is the alphabet's"
        )
    doubled = sorted({token for token in extras if extras.count(token) > 1})
    if doubled or set(extras) & set(SPECIAL_TOKENS):
        raise ValueError(
            f"extra tokens repeat {sorted(doubled or set(extras) & set(SPECIAL_TOKENS))!r} "
            f"(among themselves or the special tokens {SPECIAL_TOKENS}): list each once"
        )
    tokens = (*SPECIAL_TOKENS, *alphabet, *extras)
    vocab = {token: index for index, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # Every extra token, then every character, is its own pre-token (newlines too:
    # [\s\S], not '.'); Fuse joins the decoded tokens back with nothing between them.
    pieces = [re.escape(token) for token in sorted(extras, key=len, reverse=True)]
    pattern = "|".join([*pieces, r"[\s\S]"])
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
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


# The class a tokenizer built from a ``tokenizers.Tokenizer`` object saves itself as.
_GENERIC_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(path: str | os.PathLike[str]) -> PreTrainedTokenizerBase:
    """The tokenizer saved in directory ``path``, or of the Hub id ``path`` (`rlshell.hub`:
    read through the Hub cache; downloaded only without ``HF_HUB_OFFLINE``).

    A directory whose tokenizer names the generic fast class (the character
    tokenizer, saved beside an exported model) is loaded as that class: beside a
    model config, ``AutoTokenizer`` would substitute the model's own tokenizer class
    (transformers 5 does for Qwen2), whose pre-tokenizer splits text its own way
    (the agent's markers and spaces lost)."""
    from rlshell.hub import from_pretrained, hub_id

    if hub_id(str(path)) is not None:
        loaded: PreTrainedTokenizerBase = from_pretrained(AutoTokenizer, str(path))
        return loaded
    directory = Path(path)
    if not (directory / "tokenizer_config.json").is_file():
        raise FileNotFoundError(
            f"{directory} is not a tokenizer directory (no tokenizer_config.json there); "
            "save one with build_char_tokenizer(...).save_pretrained(dir) or ensure_tokenizer"
        )
    saved = json.loads((directory / "tokenizer_config.json").read_text()).get("tokenizer_class")
    loader = PreTrainedTokenizerFast if saved in _GENERIC_CLASSES else AutoTokenizer
    tokenizer: PreTrainedTokenizerBase = loader.from_pretrained(directory, local_files_only=True)
    return tokenizer


def ensure_tokenizer(
    path: str | os.PathLike[str],
    alphabet: str = DEFAULT_ALPHABET,
    extra_tokens: Sequence[str] = (),
) -> PreTrainedTokenizerBase:
    """The character tokenizer saved at ``path``, built and saved there first if absent.

    Several processes may call this at once: the tokenizer is written to a
    temporary directory beside ``path`` and renamed into place, so a reader
    never sees half-written files. A tokenizer found at ``path`` must have
    been built from the same ``alphabet`` and ``extra_tokens``.
    """
    directory = Path(path)
    if not (directory / "tokenizer_config.json").is_file():
        directory.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
        build_char_tokenizer(alphabet, extra_tokens).save_pretrained(staging)
        try:
            staging.rename(directory)
        except OSError:
            # Another process renamed its copy into place first (or the directory
            # exists without a tokenizer, which load_tokenizer reports below).
            shutil.rmtree(staging, ignore_errors=True)
    tokenizer = load_tokenizer(directory)
    expected = build_char_tokenizer(alphabet, extra_tokens).get_vocab()
    if tokenizer.get_vocab() != expected:
        extras = f" and the extra tokens {list(extra_tokens)!r}" if extra_tokens else ""
        raise ValueError(
            f"the tokenizer at {directory} was not built from the alphabet {alphabet!r}"
            f"{extras} (vocabulary of {len(tokenizer)} tokens, expected {len(expected)}); "
            "delete the directory or pass its alphabet"
        )
    return tokenizer


def prepare_tokenizer(config: Config, run_dir: Path) -> str:
    """The tokenizer of a run, as every process loads it (`load_tokenizer`): the given one
    (``actor.model.tokenizer_path``), the one saved with the checkpoint the model starts
    from (``actor.model.checkpoint``), the model's own (a local directory or a Hub id), or
    the project's, built here from `run_alphabet` and `agent_markers`."""
    model = config.actor.model
    if model.tokenizer_path is not None:
        source = model.tokenizer_path
    elif model.checkpoint is not None:
        source = str(Path(model.checkpoint) / "tokenizer")
        if not (Path(source) / "tokenizer_config.json").is_file():
            raise ConfigError(
                [
                    f"actor.model.checkpoint: {model.checkpoint} holds no tokenizer/ (a "
                    "reasoning or sft run's checkpoints hold the tokenizer it trained with); "
                    "set actor.model.tokenizer_path to the tokenizer its model was trained with"
                ]
            )
    elif model.path is not None:
        source = model.path
    else:
        path = run_dir / "tokenizer"
        ensure_tokenizer(path, run_alphabet(config), agent_markers(config))
        return str(path)
    load_tokenizer(source)  # a clear error now, not in every worker
    return source


def agent_markers(config: Config) -> tuple[str, ...]:
    """The agent's four markers (``agent.call_start``, ``call_end``, ``result_start``,
    ``result_end``) where the run's text holds them: the sft runner's conversations, and a
    reasoning run's tool-using rollouts (``agent.tools``); else none."""
    runner = config.runner.runner_type
    if runner != "sft" and not (runner == "reasoning" and config.agent.tools):
        return ()
    agent = config.agent
    return (agent.call_start, agent.call_end, agent.result_start, agent.result_end)


def run_alphabet(config: Config) -> str:
    """`DEFAULT_ALPHABET` and, after it, sorted, every other character of the run's text
    outside the agent's markers: the conversations' (``data.task='conversations'``, train
    and val files), or the generated arithmetic task's prompts and answers; in a run with
    tools, also the characters a call writes besides its argument (the tool names, and
    with ``agent.call_body='json'`` the JSON around them). The default run's is
    `DEFAULT_ALPHABET` itself."""
    data = config.data
    texts: list[str] = []
    if data.task == "conversations":
        from rlshell.conversation import read_conversations

        for path in (data.train_path, data.val_path):
            if path is not None:
                texts += [m.content for c in read_conversations(path) for m in c]
    elif data.task == "arithmetic":
        from rlshell.data import load_dataset

        for split in ("train", "val"):
            texts += [t for e in load_dataset(data, split) for t in (e.prompt, e.answer)]
    if config.runner.runner_type == "reasoning" and config.agent.tools:
        texts += list(_call_frames(config))
    return DEFAULT_ALPHABET + "".join(
        sorted(_characters(texts, agent_markers(config)) - set(DEFAULT_ALPHABET))
    )


def _call_frames(config: Config) -> Iterable[str]:
    """What a call to each of the run's tools writes besides its argument."""
    agent = config.agent
    for tool in agent.tools:
        if agent.call_body == "json":
            yield json.dumps({"name": tool, "arguments": ""})
        else:
            yield f"{tool} "


def _characters(texts: Iterable[str], markers: Sequence[str]) -> set[str]:
    """The characters of ``texts`` once every occurrence of ``markers`` is taken out."""
    split = re.compile("|".join(re.escape(m) for m in sorted(markers, key=len, reverse=True)))
    found: set[str] = set()
    for text in texts:
        found.update("".join(split.split(text)) if markers else text)
    return found


def with_tokenizer_ids(config: Config, tokenizer_dir: str | os.PathLike[str]) -> Config:
    """For a model built from ``model_kwargs``: vocabulary size and special ids from the tokenizer.

    An explicit ``vocab_size`` smaller than the tokenizer's vocabulary is an
    error (tokens would index past the embedding). With ``actor.model.checkpoint``
    the vocabulary must fit the checkpoint's model: a tokenizer larger than its
    embedding, or a model built from ``model_kwargs`` with another vocabulary
    size than the checkpoint's, is an error.
    """
    model = config.actor.model
    tokenizer = load_tokenizer(tokenizer_dir)
    size = len(tokenizer)
    held = None if model.checkpoint is None else _checkpoint_vocabulary(Path(model.checkpoint))
    if held is not None and size > held:
        raise ConfigError(
            [
                f"actor.model.checkpoint: its model embeds {held} tokens, fewer than the "
                f"{size} of the run's tokenizer ({tokenizer_dir}): use the tokenizer it was "
                "trained with (leave actor.model.tokenizer_path unset to take the checkpoint's)"
            ]
        )
    if model.path is not None:
        return config
    kwargs = dict(model.model_kwargs)
    given = kwargs.get("vocab_size")
    if given is not None and (not isinstance(given, int) or isinstance(given, bool)):
        raise ConfigError(
            [f"actor.model.model_kwargs.vocab_size: expected an integer, got {given!r}"]
        )
    if given is not None and given < size:
        raise ConfigError(
            [
                f"actor.model.model_kwargs.vocab_size: {given} is smaller than the tokenizer's "
                f"{size} tokens ({tokenizer_dir}); remove it to use the tokenizer's size"
            ]
        )
    vocab_size = given if given is not None else size
    kwargs["vocab_size"] = vocab_size
    if held is not None and vocab_size != held:
        raise ConfigError(
            [
                f"actor.model.checkpoint: its model embeds {held} tokens; this run's "
                f"actor.model would embed {kwargs['vocab_size']} (model_kwargs.vocab_size, else "
                f"the tokenizer's {size} tokens): set actor.model.model_kwargs.vocab_size="
                f"{held}, or use the checkpoint's tokenizer"
            ]
        )
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        value = getattr(tokenizer, key)
        if value is not None:
            kwargs.setdefault(key, int(value))
    actor = evolve(config.actor, model=evolve(model, model_kwargs=kwargs))
    return evolve(config, actor=actor)


def _checkpoint_vocabulary(checkpoint: Path) -> int | None:
    """The vocabulary size of the model a checkpoint holds, from the Hugging Face config the
    actor saves beside its shards (None: there is none, a model that is no transformers
    model)."""
    config_file = checkpoint / "hf_config" / "config.json"
    if not config_file.is_file():
        return None
    size = json.loads(config_file.read_text()).get("vocab_size")
    return int(size) if isinstance(size, int) else None

"""The ``sft`` trainer: supervised fine-tuning on demonstrations, the stage before RL.

One step, as `SFTTrainer.step` reads: the sampler's next ``runner.prompts_per_step``
conversations → one batch (`demonstration_batch`) → the actor's supervised update
(`rlshell.workers.actor.ActorWorker.run_sft`: rlcore's ``sft_loss`` on the trained
tokens, one optimizer step). The run loop around it (`rlshell.runners.loop`)
evaluates, logs, saves and exports, as for every trainer.

    python -m rlshell.train configs/sft_arithmetic.py

Each conversation of ``data.train_path`` (``data.task='conversations'``) is
rendered once, at launch, by `rlshell.conversation.render_conversation` (the
rendering the multi-turn rollout shares): token ids and the trained mask,
the assistant's tokens and the final end token. It becomes one row of a
`rlshell.rollout.RolloutBatch`: its prompt is the tokens before the first
trained one, its response the rest, ``response_mask`` the valid tokens and
``loss_mask`` the trained ones, so that the actor's machinery (micro-batches
by tokens, packing, FSDP2 and Megatron, the optimizer and schedule) serves
unchanged. A run that starts RL from the result names a checkpoint of it in
``actor.model.checkpoint`` (`rlshell.models.get_model`).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar, Self

import attrs
import torch

from rlshell.checkpoint import TrainerState
from rlshell.cluster.group import WorkerGroup
from rlshell.cluster.placement import PlacementPlan
from rlshell.cluster.ray_cluster import Cluster
from rlshell.config import AgentConfig, Config
from rlshell.conversation import ChatTurns, Message, RenderedConversation, render_conversation
from rlshell.data import Sampler, SamplerState, Split, load_conversations
from rlshell.metrics import tokens_per_second
from rlshell.rollout import RolloutBatch
from rlshell.runners.rules.sft import SFTRules, data_parallel_shares
from rlshell.runners.spec import RunSpec
from rlshell.runners.trainer import closed_on_failure
from rlshell.tokenizer import load_tokenizer, prepare_tokenizer, with_tokenizer_ids
from rlshell.workers.actor import ActorWorker

__all__ = ["Demonstration", "SFTTrainer", "demonstration_batch", "render_demonstrations"]


@attrs.frozen(eq=False)
class Demonstration:
    """One rendered conversation: its token ids and trained mask, the text of the part a
    batch holds as the response (from the first trained token on), and where it came from."""

    rendered: RenderedConversation
    response_text: str
    where: str

    @property
    def start(self) -> int:
        """The index of the first trained token: the prompt is everything before it."""
        return int(self.rendered.trained.nonzero()[0, 0])


def render_demonstrations(
    conversations: Sequence[Sequence[Message]],
    tokenizer: object,
    agent: AgentConfig,
    where: str,
    chat_template: bool = False,
) -> list[Demonstration]:
    """``conversations`` rendered (`rlshell.conversation.render_conversation`, tool messages
    wrapped in ``agent.result_start`` … ``agent.result_end``; with ``chat_template``, in the
    tokenizer's own chat template) with ``tokenizer`` (a transformers tokenizer). A
    conversation whose first token is trained (no system or user text before the
    assistant's) is refused: nothing would predict that token. ``where`` names the file in
    errors."""
    from transformers import PreTrainedTokenizerBase

    if not isinstance(tokenizer, PreTrainedTokenizerBase):
        raise TypeError(f"expected a transformers tokenizer, got {type(tokenizer).__name__}")
    chat = ChatTurns(tokenizer) if chat_template else None
    demonstrations = []
    for index, messages in enumerate(conversations):
        label = f"{where}: conversation {index + 1}"
        # The result markers wrap tool messages in plain text only (a template has its own).
        markers = ("", "") if chat else (agent.result_start, agent.result_end)
        rendered = render_conversation(messages, tokenizer, *markers, chat)
        if bool(rendered.trained[0]):
            raise ValueError(
                f"{label} starts with the assistant's tokens: a trained token needs a token "
                "before it to be predicted from; begin it with a system or user message"
            )
        start = int(rendered.trained.nonzero()[0, 0])
        text = str(tokenizer.decode(rendered.ids[start:].tolist(), skip_special_tokens=True))
        demonstrations.append(Demonstration(rendered, text, label))
    return demonstrations


def demonstration_batch(demonstrations: Sequence[Demonstration], pad_id: int) -> RolloutBatch:
    """The rows of ``demonstrations``: prompts (the tokens before the first trained one)
    left-padded with ``pad_id``, responses (the rest) right-padded; ``response_mask`` the
    responses' tokens, ``loss_mask`` their trained ones. The batch holds no sampled
    log-probs (zeros): nothing sampled it."""
    starts = [d.start for d in demonstrations]
    lengths = [int(d.rendered.ids.shape[0]) - d.start for d in demonstrations]
    rows, prompt_width, response_width = len(demonstrations), max(starts), max(lengths)
    prompt_ids = torch.full((rows, prompt_width), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((rows, prompt_width), dtype=torch.bool)
    response_ids = torch.full((rows, response_width), pad_id, dtype=torch.long)
    response_mask = torch.zeros((rows, response_width), dtype=torch.bool)
    loss_mask = torch.zeros((rows, response_width), dtype=torch.bool)
    for row, (demonstration, start, length) in enumerate(
        zip(demonstrations, starts, lengths, strict=True)
    ):
        ids, trained = demonstration.rendered.ids, demonstration.rendered.trained
        prompt_ids[row, prompt_width - start :] = ids[:start]
        prompt_mask[row, prompt_width - start :] = True
        response_ids[row, :length] = ids[start:]
        response_mask[row, :length] = True
        loss_mask[row, :length] = trained[start:]
    return RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        response_mask=response_mask,
        logprobs=torch.zeros((rows, response_width), dtype=torch.float32),
        response_texts=tuple(d.response_text for d in demonstrations),
        loss_mask=loss_mask,
    )


class SFTTrainer(SFTRules):
    """The actor group of an sft run and its supervised step.

    ``SFTTrainer.launch(spec, cluster, plan, run_dir)`` builds the run's tokenizer
    (`rlshell.tokenizer.prepare_tokenizer`: the project's character tokenizer
    gets the agent's markers as tokens of their own), renders the conversations
    and starts the actor; `step` trains on the sampler's next conversations;
    `evaluate` measures the held-out conversations' loss and token accuracy;
    `save` and `load` checkpoint the actor, the tokenizer and the sampler.
    """

    curves: ClassVar[tuple[str, ...]] = ("train/loss", "eval/loss")

    def __init__(self, config: Config, tokenizer_dir: str) -> None:
        self.config = config
        self.tokenizer_dir = tokenizer_dir
        self.actor: WorkerGroup[ActorWorker] | None = None
        self.pad_id = 0
        self.train_set: list[Demonstration] = []
        self.val_set: list[Demonstration] = []
        self.sampler: Sampler[Demonstration] | None = None

    # -- launching

    @classmethod
    def launch(cls, spec: RunSpec, cluster: Cluster, plan: PlacementPlan, run_dir: Path) -> Self:
        config = spec.config
        tokenizer_dir = prepare_tokenizer(config, run_dir)
        trainer = cls(with_tokenizer_ids(config, tokenizer_dir), tokenizer_dir)
        return closed_on_failure(trainer, lambda: trainer._launch(cluster, plan))

    def _launch(self, cluster: Cluster, plan: PlacementPlan) -> None:
        config = self.config
        tokenizer = load_tokenizer(self.tokenizer_dir)
        self.pad_id = int(tokenizer.pad_token_id)
        self.train_set = self._demonstrations(tokenizer, "train")
        if config.runner.eval_interval:
            self.val_set = self._demonstrations(tokenizer, "val")
            shares = data_parallel_shares(config, len(plan.component("actor").workers))
            if len(self.val_set) < shares:
                raise ValueError(
                    f"data.val_path: {len(self.val_set)} conversations, fewer than the actor's "
                    f"{shares} data-parallel ranks; every rank evaluates a share"
                )
        self.sampler = Sampler(
            self.train_set, config.runner.prompts_per_step, seed=config.runner.seed
        )
        started = time.perf_counter()
        # One optimizer step a step: the schedule spans runner.max_steps of them.
        self.actor = ActorWorker.create_group(config, config.runner.max_steps, False).launch(
            cluster, plan.component("actor"), call_timeout_s=config.cluster.call_timeout_s
        )
        self.actor.init_training().wait()
        trained = sum(int(d.rendered.trained.sum()) for d in self.train_set)
        print(
            f"workers up in {time.perf_counter() - started:.1f} s "
            f"({len(self.train_set)} training conversations, {trained} trained tokens; "
            f"{len(self.val_set)} held out)",
            flush=True,
        )

    def _demonstrations(self, tokenizer: object, split: Split) -> list[Demonstration]:
        data = self.config.data
        where = data.train_path if split == "train" else data.val_path
        return render_demonstrations(
            load_conversations(data, split),
            tokenizer,
            self.config.agent,
            str(where),
            data.chat_template,
        )

    # -- the step

    def step(self, step: int) -> dict[str, float]:
        """One supervised step on the sampler's next ``runner.prompts_per_step`` conversations."""
        started = time.perf_counter()
        batch = self._batch(self._sampler().next())
        metrics: dict[str, float] = self._actor().run_sft(batch).wait()[0]
        step_time = time.perf_counter() - started
        metrics["time/step"] = step_time
        metrics["perf/tokens_per_s"] = tokens_per_second(batch.num_tokens, step_time)
        metrics["perf/trained_tokens_per_s"] = tokens_per_second(
            int(batch.trained_mask.sum()), step_time
        )
        return metrics

    def evaluate(self, step: int) -> dict[str, float]:
        """``eval/loss`` (mean negative log-likelihood per trained token) and
        ``eval/token_accuracy`` (greedy predictions right) over the held-out conversations."""
        started = time.perf_counter()
        metrics: dict[str, float] = self._actor().evaluate_sft(self._batch(self.val_set)).wait()[0]
        metrics["time/eval"] = time.perf_counter() - started
        return metrics

    def _batch(self, demonstrations: Sequence[Demonstration]) -> RolloutBatch:
        return demonstration_batch(demonstrations, self.pad_id)

    # -- checkpoints

    def save(self, directory: Path, step: int) -> TrainerState:
        self._actor().save_checkpoint(str(directory), step).wait()
        # The tokenizer the model was trained with: export and actor.model.checkpoint read it.
        if Path(self.tokenizer_dir).is_dir():
            shutil.copytree(self.tokenizer_dir, directory / "tokenizer")
        else:  # a Hub id: the files as transformers loads them
            load_tokenizer(self.tokenizer_dir).save_pretrained(directory / "tokenizer")
        sampler = self._sampler().state()
        return TrainerState(
            step=step,
            sampler_epoch=sampler.epoch,
            sampler_position=sampler.position,
            experiment_name=self.config.runner.experiment_name,
        )

    def load(self, checkpoint: Path, state: TrainerState) -> int:
        step = int(self._actor().load_checkpoint(str(checkpoint)).wait()[0])
        self._sampler().load_state(SamplerState(state.sampler_epoch, state.sampler_position))
        return step

    # -- plumbing

    def _actor(self) -> WorkerGroup[ActorWorker]:
        if self.actor is None:
            raise RuntimeError("the actor group is not running")
        return self.actor

    def _sampler(self) -> Sampler[Demonstration]:
        if self.sampler is None:
            raise RuntimeError("the trainer was not launched")
        return self.sampler

    def close(self) -> None:
        if self.actor is not None:
            self.actor.shutdown()

"""Megatron-core GPT models from Hugging Face Qwen2 / Llama configs, and a causal-LM face for them.

`transformer_config` maps a transformers config onto Megatron's
``TransformerConfig`` (RMSNorm, SwiGLU, grouped-query attention, RoPE,
q/k/v biases for Qwen2) with every fusion off: the fused kernels need CUDA or
Transformer Engine, and on a GPU the unfused modules compute the same
function. `build_gpt_stage` builds this rank's pipeline stage with
Megatron-core's local layer spec (`get_gpt_layer_local_spec`, torch modules
only). `MegatronCausalLM` lets a single-stage model be called as a
transformers causal LM is (``model(input_ids=..., attention_mask=...,
position_ids=...).logits``), so the actor's forward code serves both backends.

Needs an initialised Megatron parallel state (`rlshell.engines.training.megatron.parallel`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlshell.engines.training.megatron.layout import GPTLayout

if TYPE_CHECKING:
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer import TransformerConfig

__all__ = [
    "MegatronCausalLM",
    "attention_mask_4d",
    "build_gpt_stage",
    "pipeline_logits",
    "pipeline_train_passes",
    "rope_base",
    "transformer_config",
    "unmapped_features",
]


def rope_base(hf_config: object) -> int:
    """RoPE's base from the config; scaled or non-integer RoPE is refused (not mapped)."""
    parameters = getattr(hf_config, "rope_parameters", None) or {}
    rope_type = parameters.get("rope_type", "default")
    scaling = getattr(hf_config, "rope_scaling", None)
    if rope_type != "default" or (scaling and scaling.get("rope_type", "default") != "default"):
        raise ValueError(
            f"RoPE scaling ({rope_type!r}) is not mapped to Megatron by this backend; "
            "models with default RoPE only"
        )
    theta = float(parameters.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0)))
    if theta != int(theta):
        raise ValueError(f"rope_theta {theta}: Megatron's GPTModel takes an integer base")
    return int(theta)


def unmapped_features(hf_config: object) -> list[str]:
    """What ``hf_config`` uses that the mapping to Megatron does not carry (empty: none)."""
    found = []
    activation = getattr(hf_config, "hidden_act", "silu")
    if activation != "silu":
        found.append(f"hidden_act {activation!r}: the mapping is for SwiGLU (silu)")
    if float(getattr(hf_config, "attention_dropout", 0.0) or 0.0) != 0.0:
        found.append(
            "attention_dropout must be 0: dropout is not wired through Megatron's RNG tracker here"
        )
    if getattr(hf_config, "use_sliding_window", False):
        found.append("sliding-window attention is not mapped to Megatron by this backend")
    try:
        rope_base(hf_config)
    except ValueError as error:
        found.append(str(error))
    return found


def transformer_config(
    hf_config: object, layout: GPTLayout, dtype: torch.dtype = torch.float32
) -> TransformerConfig:
    """Megatron's config for the model ``hf_config`` describes, split as ``layout`` says."""
    from megatron.core.transformer import TransformerConfig

    unmapped = unmapped_features(hf_config)
    if unmapped:
        raise ValueError("; ".join(unmapped))
    return TransformerConfig(
        num_layers=layout.num_layers,
        hidden_size=layout.hidden_size,
        num_attention_heads=layout.num_heads,
        num_query_groups=layout.num_kv_heads,
        kv_channels=layout.head_dim,
        ffn_hidden_size=layout.ffn_hidden_size,
        normalization="RMSNorm",
        layernorm_epsilon=float(getattr(hf_config, "rms_norm_eps", 1e-6)),
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=layout.qkv_bias,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        use_cpu_initialization=True,
        # CUDA / Transformer Engine kernels: off (their defaults, stated so nobody turns them on).
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        sequence_parallel=False,
        cuda_graph_scope=[],  # no CUDA graphs (Megatron's default value, "full", is deprecated)
        # Megatron's guard against an old batch_isend_irecv race is a torch.cuda.synchronize().
        batch_p2p_sync=torch.cuda.is_available(),
    )


def build_gpt_stage(
    hf_config: object,
    layout: GPTLayout,
    dtype: torch.dtype = torch.float32,
    padding_idx: int | None = None,
    *,
    pre_process: bool | None = None,
    post_process: bool | None = None,
) -> GPTModel:
    """This rank's stage of the GPT model (its tensor-parallel shard of its layers).

    ``pre_process`` / ``post_process``: whether the stage holds the embedding /
    the final norm and output layer (Megatron's names); by default, whether
    this rank is the first / the last pipeline stage.

    ``padding_idx``: the token whose embedding the lookup never trains, as
    ``nn.Embedding(padding_idx=...)`` in the Hugging Face model (Megatron's
    embedding has no such option): its positions pass no gradient into the
    embedding table. A model can sample that token, so this matters.
    """
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    config = transformer_config(hf_config, layout, dtype)
    stage = GPTModel(
        config,
        get_gpt_layer_local_spec(normalization="RMSNorm"),
        vocab_size=layout.padded_vocab_size,
        max_sequence_length=int(getattr(hf_config, "max_position_embeddings", 4096)),
        pre_process=(
            parallel_state.is_pipeline_first_stage() if pre_process is None else pre_process
        ),
        post_process=(
            parallel_state.is_pipeline_last_stage() if post_process is None else post_process
        ),
        # Tied embeddings over several stages: the last stage's output layer is its own copy
        # (Megatron's layout), built untied here because Megatron's own tying step moves the
        # copy with `.cuda()`; the training backend sums the two copies' gradients.
        share_embeddings_and_output_weights=layout.tied_embeddings and layout.pp == 1,
        position_embedding_type="rope",
        rotary_base=rope_base(hf_config),
        # Logits gathered over tensor ranks: the actor's log-prob code takes the whole vocabulary.
        parallel_output=False,
    )
    stage.real_vocab_size = layout.vocab_size  # logits past it are the padding rows
    if layout.pp > 1:
        # Stages exchange each micro-batch's shape (micro-batches differ in rows and width). Set
        # on the built config: TransformerConfig's own checks refuse it for the (unused) MoE
        # token dispatcher.
        stage.config.variable_seq_lengths = True
    if padding_idx is not None and stage.pre_process:
        stage.embedding.word_embeddings.register_forward_hook(_frozen_lookup(padding_idx))
    return stage


def _frozen_lookup(padding_idx: int) -> Callable[[nn.Module, tuple[Any, ...], Tensor], Tensor]:
    def hook(module: nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor:
        ids: Tensor = args[0]
        return torch.where((ids == padding_idx).unsqueeze(-1), output.detach(), output)

    return hook


def attention_mask_4d(attention_mask: Tensor) -> Tensor:
    """(batch, seq) valid-token mask → Megatron's (batch, 1, seq, seq) mask, True where masked.

    A query sees the valid keys at or before it (causal ∧ key valid).
    """
    seq = attention_mask.shape[1]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=attention_mask.device).tril()
    visible = causal[None, :, :] & attention_mask.bool()[:, None, :]
    return ~visible[:, None, :, :]


class _Output:
    def __init__(self, logits: Tensor) -> None:
        self.logits = logits


class MegatronCausalLM(nn.Module):
    """A one-stage GPTModel called as a transformers causal LM: ``model(...).logits``.

    Logits cover the real vocabulary (the padding rows of a vocabulary split
    over tensor ranks are dropped). RoPE positions are Megatron's (0 … seq−1):
    with left padding they are shifted from the valid-token positions, which
    leaves attention unchanged (RoPE depends on relative positions only).
    """

    def __init__(self, gpt: GPTModel, layout: GPTLayout) -> None:
        super().__init__()
        if layout.pp != 1:
            raise ValueError("MegatronCausalLM wraps a single pipeline stage (pp=1)")
        self.gpt = gpt
        self.layout = layout

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        **_: Any,
    ) -> _Output:
        batch, seq = input_ids.shape
        if attention_mask is None:
            attention_mask = torch.ones(batch, seq, dtype=torch.bool, device=input_ids.device)
        positions = torch.arange(seq, device=input_ids.device).expand(batch, seq)
        logits = self.gpt(input_ids, positions, attention_mask_4d(attention_mask))
        return _Output(logits[..., : self.layout.vocab_size])


def pipeline_logits(
    stage: GPTModel, layout: GPTLayout, micro_batches: Sequence[tuple[Tensor, Tensor]]
) -> list[Tensor] | None:
    """Logits of every micro-batch ``(input_ids, attention_mask)``, through all pipeline stages.

    Runs Megatron's pipeline schedule forward only (1F1B, one stage per rank);
    every stage takes the same micro-batches, all of one shape. Returns the
    logits (real vocabulary) on the last stage and None on the others.
    """
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from rlshell.engines.training.megatron.cpu_shim import cpu_device_mode

    shapes = {tuple(ids.shape) for ids, _ in micro_batches}
    if len(shapes) != 1:
        raise ValueError(f"pipeline micro-batches must share one shape, got {sorted(shapes)}")
    ((batch, seq),) = shapes

    def forward_step(data: Iterator[tuple[Tensor, Tensor]], model: nn.Module) -> Any:
        ids, mask = next(data)
        positions = torch.arange(seq, device=ids.device).expand(batch, seq)
        output = model(ids, positions, attention_mask_4d(mask))

        def keep(output: Tensor, non_loss_data: bool = True) -> Tensor:
            return output[..., : layout.vocab_size]

        return output, keep

    with torch.no_grad(), cpu_device_mode():
        outputs = get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(micro_batches),
            model=[stage],
            num_microbatches=len(micro_batches),
            seq_length=seq,
            micro_batch_size=batch,
            forward_only=True,
            collect_non_loss_data=True,
        )
    return list(outputs) if parallel_state.is_pipeline_last_stage() else None


def pipeline_train_passes(
    stage: nn.Module,
    micro_batches: Sequence[tuple[Tensor, Tensor]],
    loss_of: Callable[[int, Tensor], tuple[Tensor, dict[str, float]]],
) -> list[dict[str, float]] | None:
    """Forward and backward of every micro-batch ``(input_ids, attention_mask)`` through
    Megatron's 1F1B pipeline schedule; gradients accumulate in this stage's parameters.

    On the last stage ``loss_of(index, logits)`` gives micro-batch ``index``'s
    loss (its logits cover the real vocabulary) and metrics; the gradient is
    that of the losses' sum. Micro-batches may differ in rows and width (the
    stages exchange shapes). Returns the metrics on the last stage, None on
    the others.
    """
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from rlshell.engines.training.megatron.cpu_shim import cpu_device_mode

    count = len(micro_batches)
    vocab = _real_vocab(stage)

    def forward_step(data: Iterator[tuple[int, Tensor, Tensor]], model: nn.Module) -> Any:
        index, ids, mask = next(data)
        batch, seq = ids.shape
        positions = torch.arange(seq, device=ids.device).expand(batch, seq)
        output = model(ids, positions, attention_mask_4d(mask))

        def loss_func(output: Tensor) -> tuple[Tensor, dict[str, float]]:
            loss, metrics = loss_of(index, output[..., :vocab])
            # Megatron's schedule divides each micro-batch's loss by their number.
            return loss * count, metrics

        return output, loss_func

    shapes = [ids.shape for ids, _ in micro_batches]
    with cpu_device_mode():
        outputs = get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter([(i, ids, mask) for i, (ids, mask) in enumerate(micro_batches)]),
            model=[stage],
            num_microbatches=count,
            seq_length=max(shape[1] for shape in shapes),
            micro_batch_size=max(shape[0] for shape in shapes),
            forward_only=False,
        )
    return list(outputs) if parallel_state.is_pipeline_last_stage() else None


def _real_vocab(stage: nn.Module) -> int:
    vocab = getattr(stage, "real_vocab_size", None)
    if vocab is None:
        raise ValueError("the stage was not built by build_gpt_stage (no real_vocab_size)")
    return int(vocab)

"""The Megatron-core training backend (``actor.backend=megatron``): tensor, pipeline and data
parallel training of Qwen2 / Llama models, on GPUs and, through `cpu_shim`, on these CPU
machines over gloo.

- `layout`: Hugging Face weights ↔ Megatron shards (pure tensor functions);
- `model`: Megatron's ``TransformerConfig`` and ``GPTModel`` from a transformers config;
- `parallel`: Megatron's process groups over this job's ranks;
- `cpu_shim`: the two patches Megatron-core needs without CUDA, applied only there.
"""

import warnings

# Megatron-core's notices about what this backend chose on purpose, dropped (each is repeated by
# every actor process): the local layer spec's torch norms and optimizers instead of Apex and
# Transformer Engine, and torch's deprecation of the all-gather Megatron's tensor-parallel
# layers call.
for _message in (
    "Apex is not installed. Falling back to Torch Norm",
    "Transformer Engine and Apex are not installed. Falling back",
    "`torch.distributed.all_gather_into_tensor` is deprecated",
):
    warnings.filterwarnings("ignore", message=_message)

"""The Megatron-core training backend (``actor.backend=megatron``): tensor, pipeline and data
parallel training of Qwen2 / Llama models, on GPUs and, through `cpu_shim`, on these CPU
machines over gloo.

- `layout`: Hugging Face weights ↔ Megatron shards (pure tensor functions);
- `model`: Megatron's ``TransformerConfig`` and ``GPTModel`` from a transformers config;
- `parallel`: Megatron's process groups over this job's ranks;
- `cpu_shim`: the two patches Megatron-core needs without CUDA, applied only there.
"""

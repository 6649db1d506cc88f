"""GRPO on GSM8K with Qwen2.5-0.5B-Instruct on 2 nodes × 8 GPUs: the single-GPU config, scaled out.

Start Ray on both nodes first (``ray start --head`` on one, ``ray start
--address=HEAD:6379`` on the other), with the model and the data in each
node's Hugging Face cache (or let each node download them); then run this on
the head node, whose ``HF_HUB_OFFLINE``, ``HF_HUB_CACHE`` and ``HF_HOME``
every worker gets. On a machine without
that cluster, plan it with ``--dry-run cluster.simulate=2x8``. Like the
single-GPU config it samples with vLLM, whose engine is not built yet: it
plans and validates today, and runs with ``rollout.backend=hf``.
"""

import runpy
from pathlib import Path

from attrs import evolve

from rlshell.config import Config

single_gpu: Config = runpy.run_path(str(Path(__file__).with_name("grpo_qwen2_5_0_5b_gsm8k.py")))[
    "config"
]

config = evolve(
    single_gpu,
    cluster=evolve(
        single_gpu.cluster,
        address="auto",
        num_nodes=2,
        # 16 FSDP ranks, each time-sharing its GPU with a vLLM engine; a reward worker per node.
        component_placement={"actor,rollout": "all", "reward": "0-1"},
    ),
    runner=evolve(
        single_gpu.runner,
        experiment_name="grpo_qwen2_5_0_5b_gsm8k_2x8",
        prompts_per_step=512,
    ),
)

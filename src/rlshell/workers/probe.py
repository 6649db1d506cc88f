"""The probe's worker: reports what it sees of its process and joins its component's group.

`rlshell.runners.probe` launches one per planned process and checks each
report against the plan.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

import ray
import torch

from rlshell.cluster.worker import Worker
from rlshell.extensions import extension_modules

__all__ = ["ENV_KEYS", "ProbeWorker"]

ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK")


class ProbeWorker(Worker):
    """Reports what it sees, joins its component's process group, all-reduces."""

    def report(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "host": socket.gethostname(),
            "node_ip": self.node_ip,
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "env": {key: os.environ.get(key) for key in (*ENV_KEYS, "CUDA_VISIBLE_DEVICES")},
            "torch_threads": torch.get_num_threads(),
            "extensions_loaded": [name for name in extension_modules() if name in sys.modules],
        }

    def join(self) -> None:
        self.init_process_group("gloo")

    def noop(self) -> None:
        return None

    def all_reduce(self, value: float) -> float:
        import torch.distributed as dist

        tensor = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(tensor)
        return float(tensor.item())

    def leave(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

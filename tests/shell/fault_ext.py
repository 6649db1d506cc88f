"""An extension module for fault tests: a causal LM that fails on purpose during training.

``register()`` adds the model type ``faulty_lm``: the built-in ``hf_causal_lm``
with a forward hook that, on the actor's N-th training forward (counting
the response pass only when the prompts run apart)
(``RLSHELL_TEST_FAULT_AT``), either makes the logits NaN
(``RLSHELL_TEST_FAULT=nan``) or kills its own process with SIGKILL
(``RLSHELL_TEST_FAULT=kill``, rank 1 only, once: it leaves the marker file
``RLSHELL_TEST_FAULT_MARKER`` so that the resumed run trains normally).
Rollout and reference copies run in eval mode and are not affected, except by
``RLSHELL_TEST_FAULT=kill_rollout``: a rollout worker's process (eval mode, no
torch.distributed group) kills itself with SIGKILL at the start of its N-th
generation (its N-th prefill pass), once (the marker file again).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlshell.config import ModelConfig
from rlshell.models import register_model
from rlshell.models.hf_causal_lm import build_hf_causal_lm


def _build(cfg: ModelConfig, dtype: torch.dtype) -> nn.Module:
    model = build_hf_causal_lm(cfg, dtype)
    fault = os.environ.get("RLSHELL_TEST_FAULT", "")
    at = int(os.environ.get("RLSHELL_TEST_FAULT_AT", "0"))
    marker = Path(os.environ.get("RLSHELL_TEST_FAULT_MARKER", "/nonexistent/marker"))
    calls = {"training": 0, "generations": 0}

    def hook(module: nn.Module, args: Any, kwargs: dict[str, Any], output: Any) -> Any:
        if not module.training:
            if fault == "kill_rollout" and not torch.distributed.is_initialized():
                ids = kwargs.get("input_ids")
                if ids is not None and ids.shape[1] > 1:  # a prefill: a generation begins
                    calls["generations"] += 1
                    if calls["generations"] == at and not marker.exists():
                        marker.write_text("killed once\n")
                        os.kill(os.getpid(), signal.SIGKILL)
            return output
        if kwargs.get("use_cache") and kwargs.get("past_key_values") is None:
            return output  # the shared prompts' pass (`prompt_prefix_forward`): not a step's
        calls["training"] += 1
        if calls["training"] != at:
            return output
        if fault == "nan":
            output.logits = output.logits * float("nan")
        elif fault == "kill" and os.environ.get("RANK") == "1" and not marker.exists():
            marker.write_text("killed once\n")
            os.kill(os.getpid(), signal.SIGKILL)
        return output

    model.register_forward_hook(hook, with_kwargs=True)
    return model


def register() -> None:
    register_model("faulty_lm", _build, category="reasoning", force=True)

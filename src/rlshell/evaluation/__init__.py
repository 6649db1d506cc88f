"""Evaluation beyond training's own metrics: embodied policies in their envs, with intervals.

- `rlshell.evaluation.embodied`: load an embodied checkpoint's policy and
  play deterministic episodes on fresh env seeds (`evaluate_embodied`);
- `rlshell.evaluation.intervals`: Student-t and Wilson confidence intervals;
- `rlshell.evaluation.recording`: GIFs of a policy's episodes.

``python -m rlshell.evaluate`` is the command line for these and for
reasoning checkpoints.
"""

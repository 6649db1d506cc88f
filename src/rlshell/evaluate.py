"""Evaluate a checkpoint: reasoning runs on their held-out split, embodied runs in their env.

    python -m rlshell.evaluate runs/grpo/checkpoints/global_step_200
    python -m rlshell.evaluate runs/grpo/hf_model --config runs/grpo/config.json
    python -m rlshell.evaluate runs/ppo_cartpole/checkpoints/global_step_390 --episodes 50
    python -m rlshell.evaluate HuggingFaceTB/SmolLM2-135M-Instruct \\
        --config configs/grpo_smollm2.py --samples 8

PATH is a checkpoint directory (or, for a reasoning run, an exported Hugging
Face directory or a Hub id such as ``Qwen/Qwen2.5-0.5B-Instruct``, read
through the Hub cache: `rlshell.hub`). The run's resolved config (found beside a checkpoint, or
given with ``--config``; ``key.path=value`` overrides apply) says which
runner made it, and `EVALUATORS` maps the runner type to its evaluation:

- ``reasoning``: greedy decoding on the held-out split (whole multi-turn
  trajectories with the run's tools when ``agent.tools`` is set; override
  ``agent.tools=[]`` to see the model without them), scored by the run's
  correctness reward, ``reward.reward_type`` (alone, also when
  ``reward.weights`` trains on several), so the accuracy is the
  ``eval/accuracy`` the training run logs
  (``--limit N`` takes the first N examples), with its 95% Wilson interval;
  ``--samples K`` adds K samples a prompt at ``rollout.temperature``: pass@K
  and the per-sample accuracy, with their intervals; the first reward failure of
  each kind is printed to stderr with its traceback, and the share of failed
  calls is ``reward/failed_frac``;
- ``embodied``: the policy's deterministic (``mode="eval"``) actions for
  ``--episodes`` episodes on ``--num-envs`` copies of the run's env, seeded
  apart from training (``--seed``), with a GIF per task written to
  ``<run dir>/eval/step_N/`` (``--no-gif`` skips it); see
  `rlshell.evaluation.embodied`.

It runs in this process: no Ray, no workers. One JSON object is printed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from attrs import evolve, frozen

from rlshell.checkpoint import RUN_CONFIG, TRAINER_STATE, CheckpointError, run_config_path
from rlshell.config import AgentConfig, Config, ConfigError
from rlshell.evaluation.embodied import EvaluationError, missing_checkpoint_message
from rlshell.evaluation.intervals import student_t_interval, wilson_interval
from rlshell.extensions import ExtensionError, load_extensions
from rlshell.hub import from_pretrained, hub_id
from rlshell.runners.validation import load_config

if TYPE_CHECKING:
    from rlshell.data import PromptExample
    from rlshell.engines.rollout.multi_turn import TokenEngine
    from rlshell.rollout import SamplingParams

__all__ = ["EVALUATORS", "Evaluator", "evaluate", "main"]


def _load(path: Path, config: Config) -> tuple[torch.nn.Module, Any]:
    if (path / TRAINER_STATE).is_file():
        from rlshell.export import load_policy

        policy = load_policy(path, config)
        return policy.model, policy.tokenizer
    if (path / "config.json").is_file() or hub_id(str(path)) is not None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model: torch.nn.Module = from_pretrained(AutoModelForCausalLM, str(path))
        return model.eval(), from_pretrained(AutoTokenizer, str(path))
    raise CheckpointError(
        f"{path} is neither a checkpoint (no {TRAINER_STATE}) nor a Hugging Face model "
        "directory (no config.json) nor a Hub id (org/name)"
    )


def _config_beside(path: Path) -> Path:
    """The run config of a checkpoint (``<run dir>/config.json`` two levels up) or of an export
    in its run directory (one level up); `ConfigError` when there is none."""
    candidates = [run_config_path(path), path.parent / RUN_CONFIG]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise ConfigError(
        [
            f"--config: no run config beside {path} (looked for "
            f"{' and '.join(str(c) for c in candidates)}); name the run's config.json or a "
            "config file with --config"
        ]
    )


def evaluate(
    path: Path,
    config: Config,
    *,
    limit: int | None = None,
    batch_size: int = 64,
    samples: int = 0,
    seed: int = 0,
) -> dict[str, float]:
    """Greedy accuracy of the policy at ``path`` on ``config``'s held-out split, with its 95%
    Wilson interval; with ``samples`` k > 0, also k samples per prompt at
    ``rollout.temperature`` (and top-p/top-k): the mean per-sample accuracy (95% t interval
    over the prompts' means) and pass@k, the share of prompts with a right sample among
    the k (Wilson interval)."""
    from rlshell.data import load_prompts
    from rlshell.engines.rollout.hf import HFRolloutEngine
    from rlshell.rollout import SamplingParams

    model, tokenizer = _load(path, config)
    examples = load_prompts(config.data, "val", lambda: tokenizer)
    if limit is not None:
        examples = examples[:limit]
    if not examples:
        raise ConfigError(["data: the held-out split is empty (set data.val_path or data.num_val)"])
    engine = HFRolloutEngine(model, tokenizer, torch.device("cpu"))
    started = time.perf_counter()
    greedy = SamplingParams(n=1, max_new_tokens=config.rollout.max_new_tokens, greedy=True)
    scores, report = _score(engine, tokenizer, config, examples, greedy, batch_size, None)
    report["time/eval"] = time.perf_counter() - started
    report.update(_interval("eval/accuracy", sum(scores), len(scores)))
    if samples:
        rollout = config.rollout
        params = SamplingParams(
            n=samples,
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            top_k=rollout.top_k,
            max_new_tokens=rollout.max_new_tokens,
        )
        started = time.perf_counter()
        sampled, sampled_report = _score(
            engine, tokenizer, config, examples, params, max(1, batch_size // samples), seed
        )
        per_prompt = [sampled[i * samples : (i + 1) * samples] for i in range(len(examples))]
        means = [sum(group) / samples for group in per_prompt]
        solved = sum(1 for group in per_prompt if max(group) > 0)
        report[f"eval/pass@{samples}"] = solved / len(examples)
        report.update(_interval(f"eval/pass@{samples}", solved, len(examples)))
        report["eval/sample_accuracy"] = sum(means) / len(means)
        interval = student_t_interval(means)
        if interval is not None:
            report["eval/sample_accuracy_low"] = max(0.0, interval[0])
            report["eval/sample_accuracy_high"] = min(1.0, interval[1])
        report["eval/samples_per_prompt"] = float(samples)
        report["eval/temperature"] = config.rollout.temperature
        for key in ("reward/timeouts", "reward/errors"):
            report[key] += sampled_report[key]
        report["time/eval_samples"] = time.perf_counter() - started
    return report


def _interval(key: str, successes: float, trials: int) -> dict[str, float]:
    """``key``'s 95% Wilson interval, as ``key_low`` and ``key_high``."""
    low, high = wilson_interval(round(successes), trials)
    return {f"{key}_low": low, f"{key}_high": high}


def _score(
    engine: TokenEngine,
    tokenizer: Any,
    config: Config,
    examples: Sequence[PromptExample],
    params: SamplingParams,
    batch_size: int,
    seed: int | None,
) -> tuple[list[float], dict[str, float]]:
    """Each example's responses (``params.n`` each, in example order) scored by the run's
    correctness reward, and the figures of that pass."""
    from rlshell.engines.rollout.multi_turn import agent_metrics, make_agent_loop, sample
    from rlshell.rewards.failures import FailureWatch
    from rlshell.rewards.pool import RewardPool
    from rlshell.rollout import RolloutBatch

    texts: list[str] = []
    batches: list[RolloutBatch] = []
    agent = make_agent_loop(config, tokenizer)  # agent.tools: whole multi-turn trajectories
    try:
        for number, start in enumerate(range(0, len(examples), batch_size)):
            chunk = examples[start : start + batch_size]
            chunk_seed = None if seed is None else seed + number
            batch = sample(engine, agent, [e.prompt for e in chunk], params, chunk_seed)
            texts.extend(batch.response_texts)
            batches.append(batch)
    finally:
        if agent is not None:
            agent.close()
    tools = {}
    if agent is not None:
        merged = RolloutBatch.concat(batches, int(tokenizer.pad_token_id))
        tools = {
            key.replace("agent/", "eval/"): value
            for key, value in agent_metrics(merged).items()
            if key.startswith("agent/") or key in ("tools/calls", "tools/failed_frac")
        }
    reward = config.reward
    answers = [e.answer for e in examples for _ in range(params.n)]
    with RewardPool(
        reward.reward_type,
        timeout_s=reward.timeout_s,
        num_processes=reward.num_processes,
        memory_mb=reward.memory_mb,
        isolation=reward.isolation,
    ) as pool:
        result = pool.score(texts, answers)
        # Shown, never stopped on: an evaluation is one batch, and its figures say what failed.
        watch = FailureWatch(reward.reward_type, pool.function, max_failed_steps=0)
    for line in watch.notices(result, "the evaluation"):
        print(line, file=sys.stderr, flush=True)
    scores = list(result.scores)
    return scores, {
        "eval/accuracy": sum(scores) / len(scores),
        "eval/examples": float(len(examples)),
        "reward/timeouts": float(result.timeouts),
        "reward/errors": float(result.errors),
        "reward/failed_frac": result.failed_frac,
        **tools,
    }


@frozen
class Evaluator:
    """How one runner type's checkpoints are evaluated: a function, and the CLI options it reads.

    ``run(path, config, args)`` returns the JSON object to print; ``options``
    names the ``args`` attributes it reads (any other evaluator option given
    on the command line is refused).
    """

    run: Callable[[Path, Config, argparse.Namespace], dict[str, Any]]
    options: frozenset[str]


def _evaluate_reasoning(path: Path, config: Config, args: argparse.Namespace) -> dict[str, Any]:
    if args.no_tools:
        config = without_tools(config)
    report = evaluate(path, config, limit=args.limit, samples=args.samples or 0)
    return {"path": str(path), **report}


def without_tools(config: Config) -> Config:
    """``config`` with its model's tools taken away (``--no-tools``): one turn as long as a
    whole trajectory could be, so the model has the same room to write its answer itself."""
    agent = config.agent
    if not agent.tools:
        raise ConfigError(["--no-tools: this run has no tools (agent.tools is empty)"])
    budget = agent.max_total_tokens or agent.max_turns * config.rollout.max_new_tokens
    rollout = evolve(config.rollout, max_new_tokens=budget)
    return evolve(config, agent=AgentConfig(), rollout=rollout)


def _evaluate_embodied(path: Path, config: Config, args: argparse.Namespace) -> dict[str, Any]:
    from rlshell.evaluation.embodied import EmbodiedEvalSettings, evaluate_embodied

    defaults = EmbodiedEvalSettings()
    settings = EmbodiedEvalSettings(
        episodes=args.episodes if args.episodes is not None else defaults.episodes,
        num_envs=args.num_envs,
        seed=args.seed if args.seed is not None else defaults.seed,
        gif=args.gif if args.gif is not None else defaults.gif,
    )
    result = evaluate_embodied(path, config, settings)
    if result.gif_warning is not None:
        print(f"warning: {result.gif_warning}", file=sys.stderr)
    return {"path": str(path), **result.report()}


# runner.runner_type -> its evaluation. SAC runs are embodied runs (algorithm.loss_type='sac'):
# their checkpoint layout is an entry of rlshell.evaluation.embodied.POLICY_LAYOUTS.
EVALUATORS: dict[str, Evaluator] = {
    "reasoning": Evaluator(_evaluate_reasoning, frozenset({"limit", "no_tools", "samples"})),
    "embodied": Evaluator(_evaluate_embodied, frozenset({"episodes", "num_envs", "seed", "gif"})),
}
_OPTION_FLAGS = {
    "limit": "--limit",
    "no_tools": "--no-tools",
    "samples": "--samples",
    "episodes": "--episodes",
    "num_envs": "--num-envs",
    "seed": "--seed",
    "gif": "--gif/--no-gif",
}


def _evaluator_for(config: Config) -> Evaluator:
    runner = config.runner.runner_type
    evaluator = EVALUATORS.get(runner)
    if evaluator is None:
        raise ConfigError(
            [
                f"runner.runner_type: '{runner}' runs have no evaluation; "
                f"python -m rlshell.evaluate evaluates {', '.join(sorted(EVALUATORS))} runs"
            ]
        )
    return evaluator


def _foreign_options(evaluator: Evaluator, args: argparse.Namespace) -> list[str]:
    """The evaluator options given on the command line that ``evaluator`` does not read."""
    return [
        flag
        for option, flag in _OPTION_FLAGS.items()
        if option not in evaluator.options and getattr(args, option) is not None
    ]


def _int_at_least(minimum: int, what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rlshell.evaluate",
        description=(
            "Evaluate a checkpoint: greedy accuracy on the held-out split (reasoning runs), "
            "or episode returns and success in the run's env (embodied runs). Prints one "
            "JSON object."
        ),
    )
    parser.add_argument(
        "path", type=Path, help="a checkpoint, a Hugging Face model directory or a Hub id"
    )
    parser.add_argument("overrides", nargs="*", metavar="key.path=value")
    parser.add_argument("--config", type=Path, help="the run's config.json or a config file")
    reasoning = parser.add_argument_group("reasoning runs")
    reasoning.add_argument("--limit", type=int, help="evaluate the first N held-out examples")
    reasoning.add_argument(
        "--samples",
        type=_int_at_least(1, "a positive int"),
        metavar="K",
        help="also K samples per prompt at rollout.temperature: pass@K and per-sample accuracy",
    )
    reasoning.add_argument(
        "--no-tools",
        action="store_const",
        const=True,
        default=None,
        help="a run with agent.tools: the model alone, one turn as long as a trajectory",
    )
    embodied = parser.add_argument_group("embodied runs")
    embodied.add_argument(
        "--episodes", type=_int_at_least(1, "a positive int"), help="episodes to play (default 20)"
    )
    embodied.add_argument(
        "--num-envs",
        type=_int_at_least(1, "a positive int"),
        help="envs stepped side by side (default: the run's env.num_envs, at most --episodes)",
    )
    embodied.add_argument(
        "--seed",
        type=_int_at_least(0, "a non-negative int"),
        help="evaluation seed (default 0); env seeds are drawn apart from training's",
    )
    embodied.add_argument(
        "--gif",
        action=argparse.BooleanOptionalAction,
        help="write a GIF of one episode per task to <run dir>/eval/step_N/ (default: on)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    try:
        load_extensions(where="evaluate")
        if not args.path.exists() and hub_id(str(args.path)) is None:
            raise CheckpointError(missing_checkpoint_message(args.path))
        source = args.config or _config_beside(args.path)
        config = load_config(source, args.overrides)
        evaluator = _evaluator_for(config)
        foreign = _foreign_options(evaluator, args)
        if foreign:
            parser.error(
                f"{', '.join(foreign)}: not an option of the evaluation of "
                f"{config.runner.runner_type} runs"
            )
        report = evaluator.run(args.path, config, args)
    except (
        ConfigError,
        CheckpointError,
        EvaluationError,
        ExtensionError,
        FileNotFoundError,
    ) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    from rlshell.process import exit_process

    exit_process(main())

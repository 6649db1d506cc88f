"""``python -m rlshell.record``: record an expert's episodes as demonstrations for embodied SFT.

    python -m rlshell.record CONFIG [KEY=VALUE ...] --expert EXPERT --episodes N --out FILE
    python -m rlshell.record --show FILE

The episodes are played in the config's env (``env.*``, validated as for a run); the
expert is ``metaworld`` (MetaWorld's scripted policy for the task) or ``checkpoint:PATH``
(the policy of a checkpoint of a run of this config), `rlshell.demonstrations.make_expert`.
``--only-success`` keeps successful episodes only. ``--observe KEY=VALUE ...`` records
what the same envs show under those overrides instead (``env.obs_mode=rgb``: a camera
where the expert reads the state), played in lockstep with the same seed and actions
(`rlshell.demonstrations.record_demonstrations`'s ``observed``). The file (`rlshell.demonstrations`:
safetensors, verified when loaded) is what ``data.train_path`` / ``data.val_path`` of an
embodied sft run name. Exit status: 0 done, 1 a file that cannot be read, 2 a bad
command line or config.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from rlshell.api import load_config
from rlshell.config import ConfigError
from rlshell.demonstrations import (
    DemonstrationError,
    describe,
    load_demonstrations,
    make_expert,
    record_demonstrations,
    save_demonstrations,
)
from rlshell.envs.stepper import EnvStepper

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rlshell.record", description="record an expert's episodes"
    )
    parser.add_argument("config", nargs="?", help="the config whose env.* the episodes use")
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE overrides of the config")
    parser.add_argument("--expert", help="'metaworld' or 'checkpoint:PATH'")
    parser.add_argument("--episodes", type=int, help="how many episodes to keep")
    parser.add_argument("--out", type=Path, help="the .safetensors file to write")
    parser.add_argument("--seed", type=int, default=0, help="the envs' reset seed")
    parser.add_argument("--only-success", action="store_true", help="keep successes only")
    parser.add_argument(
        "--observe",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="record the envs as these env.* overrides observe them (e.g. env.obs_mode=rgb)",
    )
    parser.add_argument("--show", type=Path, metavar="FILE", help="print what FILE holds")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.show is not None:
        try:
            print(describe(load_demonstrations(args.show)))
        except DemonstrationError as error:
            print(error, file=sys.stderr)
            return 1
        return 0
    missing = [
        flag
        for flag, value in (
            ("CONFIG", args.config),
            ("--expert", args.expert),
            ("--episodes", args.episodes),
            ("--out", args.out),
        )
        if value is None
    ]
    if missing:
        parser.print_usage(sys.stderr)
        print(f"{', '.join(missing)}: required to record", file=sys.stderr)
        return 2
    if args.episodes < 1:
        print("--episodes: at least 1", file=sys.stderr)
        return 2
    outside_env = [o for o in args.observe if not o.startswith("env.")]
    if outside_env:
        print(f"--observe: env.* overrides only, got {outside_env}", file=sys.stderr)
        return 2
    try:
        config = load_config(args.config, list(args.overrides))
        seen = load_config(args.config, [*args.overrides, *args.observe])
        expert, name = make_expert(args.expert, config)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    stepper = EnvStepper.from_config(config.env, args.seed)
    observed = EnvStepper.from_config(seen.env, args.seed) if args.observe else None
    try:
        demos = record_demonstrations(
            stepper,
            expert,
            args.episodes,
            args.seed,
            name=name,
            only_success=args.only_success,
            observed=observed,
        )
    finally:
        stepper.close()
        if observed is not None:
            observed.close()
    save_demonstrations(demos, args.out)
    print(f"wrote {args.out}\n{describe(demos)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

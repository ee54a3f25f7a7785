"""Train a model of the zoo.

  python train.py                                   # tiny FoX on MQAR (CPU, a few minutes)
  python train.py --config configs/fox_tiny_text.py data.train_files=book.txt
  python train.py --config paper:fox_125m data.kind=tokens data.train_tokens=data/train
  python train.py --config ... train.run_name=NAME --resume     # continue NAME's latest checkpoint
  python train.py --config ... train.init_from=runs/A[:STEP]   # a new run from run A's weights

Any config field can be overridden as section.field=value (see lpcjax/config.py). Several
processes (multi-host): set LPCJAX_DISTRIBUTED=1 (or run under a launcher that sets up
jax.distributed's environment) and start the same command on every host.
"""

import argparse
import json
import os
import sys

from lpcjax import cli, interrupts  # standard library only: JAX is imported later, inside main

DEFAULT_CONFIG = "fox_tiny_mqar"
CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")


def _train(args):
  """(run_dir, summary), or (None, None) after --print-config."""
  if os.environ.get("LPCJAX_DISTRIBUTED") == "1":
    import jax
    jax.distributed.initialize()  # coordinator, process count and id from the environment

  from lpcjax import experiment
  from lpcjax.training import train

  config = experiment.load_experiment(args.config, CONFIG_DIR)
  config = experiment.apply_overrides(config, args.overrides)
  if args.print_config:
    print(experiment.to_json(config))
    return None, None
  return train(config, resume=args.resume)


def main(argv=None):
  with interrupts.remembered():  # a Ctrl-C during imports or compilation is never lost
    return _main(argv)


def _main(argv):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", default=DEFAULT_CONFIG,
                      help=f"experiment file, or a name in configs/ (default: {DEFAULT_CONFIG})")
  parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
  resume = parser.add_mutually_exclusive_group()
  resume.add_argument("--resume", action="store_const", const=True, default=False,
                      help="continue the run's latest checkpoint (state and data order); none is an error")
  resume.add_argument("--resume-or-start", dest="resume", action="store_const", const="or_start",
                      help="continue the run's latest checkpoint, or start the run if it has none")
  parser.add_argument("overrides", nargs="*", help="section.field=value")
  args = parser.parse_intermixed_args(argv)  # flags and overrides in any order

  try:
    outcome = cli.exit_status(lambda: _train(args))
  except KeyboardInterrupt:  # only before the trainer starts: from then on a stop is graceful
    print("error: interrupted before training started; nothing was written", file=sys.stderr)
    return 130
  if outcome == cli.USAGE_ERROR:
    return outcome
  run_dir, summary = outcome
  if summary is None:
    return 0
  if summary.get("already_complete"):
    print(f"{run_dir} is already at step {summary['step']} = train.steps: nothing to train "
          "(raise train.steps to train on)")
    return 0
  if summary["preempted"] and not os.path.isdir(run_dir):  # stopped before the first step
    print("stopped by a signal before the first step: nothing trained, nothing kept; run the same command "
          "again to start", file=sys.stderr)
    return 0
  print(json.dumps(summary, indent=2))
  if summary["preempted"]:
    print(f"stopped by a signal: checkpoint at step {summary['step']}; continue with --resume", file=sys.stderr)
  print(f"run directory: {run_dir}")
  return 0


if __name__ == "__main__":
  sys.exit(main())

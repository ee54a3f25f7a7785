"""Train a model of the zoo: ``lpcjax-train`` (installed), or ``python train.py`` in a checkout.

  python train.py                                   # tiny FoX on MQAR (CPU, a few minutes)
  python train.py --config fox_tiny_text data.train_files=book.txt
  python train.py --config paper:fox_125m data.kind=tokens data.train_tokens=data/train
  python train.py --config ... train.run_name=NAME --resume     # continue NAME's latest checkpoint
  python train.py --config ... train.init_from=runs/A[:STEP]   # a new run from run A's weights
  python train.py --config fox_tiny_text --tokenizer-file gpt2.tiktoken data.train_files=book.txt
  python train.py --list-configs                    # the named experiments (configs/)
  python train.py --config paper:fox_760m --compile-for h100x8   # does it fit 8 H100s? (nothing is run)

Any config field can be overridden as section.field=value: --print-config shows them all, with
their values (docs/training.md explains them). A named experiment (--list-configs) or an
experiment file of your own (--config path/to/file.py) gives the starting values. The GPT-2
tokenizer comes from --tokenizer-file (= data.tokenizer_file), else $LPCJAX_TIKTOKEN_FILE, else
(token files) the rank file the token file was prepared with, else the GPT-2 rank file lpcjax
ships (offline, no setup); the run records the file in its config.json, so eval.py and generate
read the same one. Several
processes (multi-host): set LPCJAX_DISTRIBUTED=1 (or run under a launcher that sets up
jax.distributed's environment) and start the same command on every host.

One trainer at a time holds a run directory (RUN/train.lock): a second one exits 2 naming the
holder. Exit status: 0 when the run reached train.steps (or already had: nothing to train); 2 for bad
input, a run directory held or not writable, a checkpoint the disk could not take (one line on
stderr, nothing written); 130 when SIGINT/SIGTERM stopped it before
train.steps (a checkpoint of the last step is kept; the last line prints the command that
continues it: the same arguments with train.run_name=NAME --resume).
"""

import argparse
import dataclasses
import importlib.util
import json
import os
import shlex
import sys

from lpcjax import cli, interrupts  # standard library only: JAX is imported later, inside main
from lpcjax.files import check_writable

DEFAULT_CONFIG = "fox_tiny_mqar"
EXIT_STOPPED = 130  # stopped by SIGINT/SIGTERM before train.steps (also: before training started)


def _config_dir():
  """The named experiments: the checkout's configs/, installed with the package as
  lpcjax.configs (an editable install maps that name to the checkout's folder), so that an
  installed lpcjax finds them from any folder."""
  spec = importlib.util.find_spec("lpcjax.configs")
  if spec is not None and spec.submodule_search_locations:
    return list(spec.submodule_search_locations)[0]
  return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")


CONFIG_DIR = _config_dir()


def resume_command(argv, run_name):
  """The command that continues run ``run_name``: this call's arguments ``argv`` without its
  resume flag and run name, then ``train.run_name=NAME --resume`` (a run named by its start
  time can only be resumed by that name), started as this one was (``lpcjax-train`` or
  ``python train.py``)."""
  # train.resume_step is a one-off: continuing the run again means its latest step
  kept = [arg for arg in argv if arg not in ("--resume", "--resume-or-start")
          and not arg.startswith(("train.run_name=", "train.resume_step="))]
  return shlex.join([*_this_command(), *kept, f"train.run_name={run_name}", "--resume"])


def _this_command():
  if os.path.basename(sys.argv[0] if sys.argv else "") == "lpcjax-train" or not os.path.isfile(TRAIN_PY):
    return ["lpcjax-train"]  # the console script, or an installed lpcjax with no checkout beside it
  relative = os.path.relpath(TRAIN_PY)
  return ["python", TRAIN_PY if relative.startswith("..") else relative]


# the checkout's train.py, which a resume command names when there is one
TRAIN_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "train.py")


def _resolved_config(args):
  """The experiment the arguments name, with their overrides and tokenizer file applied."""
  from lpcjax import experiment
  from lpcjax.data import with_tokenizer
  config = experiment.load_experiment(args.config, CONFIG_DIR)
  config = experiment.apply_overrides(config, args.overrides)
  if args.tokenizer_file and not hasattr(config.data, "tokenizer_file"):
    raise experiment.ConfigError(f"--tokenizer-file: data.kind={config.data.kind} uses no tokenizer")
  return dataclasses.replace(config, data=with_tokenizer(config.data, args.tokenizer_file))


def _compile_for(args):
  """--compile-for: the step compiled for the target, its plan printed; 0 if it fits, else 1."""
  os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the target's devices are compile-only: none is used here
  from lpcjax.aot.targets import parse_target  # standard library: a mistyped target is answered before JAX
  parse_target(args.compile_for)
  config = _resolved_config(args)
  if args.json:  # before minutes of compiling, not after
    check_writable(os.path.dirname(os.path.abspath(args.json)), "choose another path with --json")
  from lpcjax.aot.plan import compile_for
  interrupts.raise_if_requested()  # a Ctrl-C held back while JAX loaded: before minutes of compiling
  return compile_for(config, args.compile_for, args.json)


def _train(args, argv):
  """(run_dir, summary), or (None, None) after --print-config."""
  if os.environ.get("LPCJAX_DISTRIBUTED") == "1":
    import jax
    jax.distributed.initialize()  # coordinator, process count and id from the environment

  from lpcjax import experiment  # no JAX: the config and the paths are checked before it loads
  interrupts.raise_if_requested()  # (each safe point: a Ctrl-C an import held back)
  if args.list_configs:
    for name, description in experiment.config_names(CONFIG_DIR).items():
      print(f"{name:<16} {description}")
    return None, None
  config = _resolved_config(args)
  interrupts.raise_if_requested()
  if args.print_config:
    print(experiment.to_json(config))
    return None, None
  config.data.check_input_files()
  run_folder = os.path.join(config.train.run_dir, config.train.run_name or "")
  check_writable(run_folder, "choose a writable folder with train.run_dir=PATH")
  from lpcjax.training import train
  interrupts.raise_if_requested()  # a Ctrl-C held back while JAX loaded: before the run folder exists

  hooks = experiment.experiment_hooks(args.config, config, CONFIG_DIR)  # the file's get_hooks(config), if any
  return train(config, resume=args.resume, resume_command=lambda run_name: resume_command(argv, run_name),
               hooks=hooks)


def main(argv=None):
  with interrupts.remembered():  # a Ctrl-C during imports or compilation is never lost
    try:
      return _main(argv)
    except KeyboardInterrupt:  # only before the trainer starts (or in --compile-for): from then on a stop is graceful
      print("error: interrupted before training started; nothing was written", file=sys.stderr)
      return EXIT_STOPPED


def _main(argv):
  parser = argparse.ArgumentParser(description=cli.help_text(__doc__, "python train.py", "lpcjax-train"),
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", default=DEFAULT_CONFIG,
                      help=f"experiment file, or a name in configs/ (default: {DEFAULT_CONFIG})")
  parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
  parser.add_argument("--list-configs", action="store_true", help="list the experiment files in configs/ and exit")
  parser.add_argument("--tokenizer-file", default=None,
                      help="tiktoken rank file of the GPT-2 tokenizer (offline use); "
                           "= data.tokenizer_file")
  resume = parser.add_mutually_exclusive_group()
  resume.add_argument("--resume", action="store_const", const=True, default=False,
                      help="continue the run's latest checkpoint (state and data order); none is an error")
  resume.add_argument("--resume-or-start", dest="resume", action="store_const", const="or_start",
                      help="continue the run's latest checkpoint, or start the run if it has none")
  parser.add_argument("--compile-for", metavar="TARGET", default=None,
                      help="compile the training step for chips that are not here (h100, h100x8, 2xh100x8, "
                           "h200x8, v5e-8, v5e-16, v5p-8, v6e-8) and say whether it fits; nothing is trained or "
                           "written (needs pip install 'lpcjax[aot]', Python >= 3.12)")
  parser.add_argument("--json", metavar="PATH", default=None, help="with --compile-for: the plan as JSON too")
  parser.add_argument("overrides", nargs="*", help="section.field=value")
  argv = sys.argv[1:] if argv is None else list(argv)
  args = parser.parse_intermixed_args(argv)  # flags and overrides in any order
  if args.json and not args.compile_for:
    parser.error("--json goes with --compile-for")
  if args.compile_for:
    if args.resume:
      parser.error("--compile-for compiles a step and trains nothing: it takes no --resume")
    return cli.exit_status(lambda: _compile_for(args))  # 0 fits, 1 does not (its line says by how much), 2 error

  outcome = cli.exit_status(lambda: _train(args, argv))
  if outcome == cli.USAGE_ERROR:
    return outcome
  run_dir, summary = outcome
  if summary is None:
    return 0
  if summary.get("already_complete"):
    print(f"{run_dir} is already at step {summary['step']} = train.steps: nothing to train "
          "(raise train.steps to train on)")
    return 0
  # A run that stopped short of train.steps is not a success: `train.py && eval.py` must not
  # evaluate half a run. EXIT_STOPPED, as a shell reports a Ctrl-C, whichever signal it was.
  if summary["preempted"] and not os.path.isdir(run_dir):  # stopped before the first step
    print("stopped by a signal before the first step: nothing trained, nothing kept; run the same command "
          "again to start", file=sys.stderr)
    return EXIT_STOPPED
  print(json.dumps(summary, indent=2))
  print(f"run directory: {run_dir}")
  if summary["preempted"]:
    print(f"stopped by a signal at step {summary['step']}, before train.steps: checkpoint saved; "
          f"continue with: {resume_command(argv, os.path.basename(run_dir))}", file=sys.stderr)
    return EXIT_STOPPED
  return 0


def run():
  """The console script ``lpcjax-train``."""
  cli.finish(main())


if __name__ == "__main__":
  run()

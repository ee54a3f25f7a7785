"""Evaluate trained runs with their family's evaluator: ``lpcjax-eval`` (installed), or ``python
eval.py`` in a checkout.

  python eval.py --run runs/NAME                        # language models: the run's eval data at 4x its length
  python eval.py --run runs/NAME --data held_out.txt --eval-len 2048 --needle --haystack essays/*.txt
  python eval.py --compare runs/A runs/B --data held_out.txt --out docs/compare

The options after --run/--compare/--out belong to the family's evaluator: `python eval.py --run
RUN --help` lists them. Writes the evaluator's JSON and PNG plots into --out (default RUN/eval, or the
folder the evaluator names for its options, e.g. RUN/eval_random_init).
"""

import argparse
import os
import sys

from lpcjax import cli, interrupts  # standard library only: JAX is imported later, inside main
from lpcjax.files import check_run_path, check_writable


def _run_parser(add_help):
  parser = argparse.ArgumentParser(description=cli.help_text(__doc__, "python eval.py", "lpcjax-eval"),
                                   add_help=add_help,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  runs = parser.add_mutually_exclusive_group(required=add_help)
  runs.add_argument("--run", help="a run directory (config.json + checkpoints/)")
  runs.add_argument("--compare", nargs="+", help="several run directories, overlaid")
  parser.add_argument("--out", default=None, help="output folder (default: RUN/eval)")
  parser.add_argument("--step", type=int, default=None,
                      help="the checkpoint step to evaluate, of each run (default: the latest)")
  parser.add_argument("--tokenizer-file", default=None,
                      help="tiktoken rank file of the GPT-2 tokenizer, instead of the one the "
                           "run recorded (default: the run's, else $LPCJAX_TIKTOKEN_FILE, else "
                           "the one lpcjax ships)")
  return parser


def main(argv=None):
  with interrupts.remembered():  # a Ctrl-C that a GC callback swallowed still stops before writing
    try:
      return _main(argv)
    except KeyboardInterrupt:  # results are written atomically: an interrupted write leaves the old ones
      print("error: interrupted; no new results were written", file=sys.stderr)
      return 130


def _main(argv):
  known, _ = _run_parser(add_help=False).parse_known_args(argv)
  if not (known.run or known.compare):
    _run_parser(add_help=True).parse_args(argv)  # prints usage (or --help) and exits

  run_dirs = [known.run] if known.run else known.compare
  return cli.exit_status(lambda: _evaluate(argv, run_dirs))



def _evaluate(argv, run_dirs):
  for run in run_dirs:  # a mistyped path is answered before JAX is imported
    check_run_path(run)
  from lpcjax.runs import evaluators_of, load_run, read_config
  interrupts.raise_if_requested()  # a Ctrl-C held back while JAX loaded

  configs = [read_config(run) for run in run_dirs]  # once per run: the evaluators, then the loads
  evaluators = evaluators_of(configs)
  parser = _run_parser(add_help=True)
  evaluators[0].add_arguments(parser)
  args = parser.parse_args(argv)
  # An evaluator may name its default folder by its options (a random init: not over the trained results).
  out = args.out or os.path.join(run_dirs[0], getattr(evaluators[0], "out_name", lambda _: "eval")(args))
  check_writable(out, "choose another folder with --out DIR")  # before minutes of evaluation, not after
  results = [evaluator.evaluate(load_run(run, step=args.step, tokenizer_file=args.tokenizer_file, config=config), args)
             for evaluator, run, config in zip(evaluators, run_dirs, configs)]
  interrupts.raise_if_requested()  # before writing: results are written whole or not at all
  evaluators[0].write(results, out, args)
  for evaluator, result in zip(evaluators, results):
    print("\n".join(evaluator.report(result)))
  print(f"wrote {out}")
  return 0


def run():
  """The console script ``lpcjax-eval``."""
  cli.finish(main())


if __name__ == "__main__":
  run()

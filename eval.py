"""Evaluate trained runs: per-token loss, perplexity vs context length, needle, recall.

  python eval.py --run runs/NAME                        # the run's eval data at 4x its length
  python eval.py --run runs/NAME --data held_out.txt --eval-len 2048 --needle --haystack essays/*.txt
  python eval.py --compare runs/A runs/B --data held_out.txt --out docs/compare

Writes per_token.json (compare.json) and PNG plots into --out (default RUN/eval).
"""

import argparse
import json
import os
import sys


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  runs = parser.add_mutually_exclusive_group(required=True)
  runs.add_argument("--run", help="a run directory (config.json + checkpoints/)")
  runs.add_argument("--compare", nargs="+", help="several run directories, overlaid")
  parser.add_argument("--data", nargs="+", help="text files to evaluate on (default: the run's eval data)")
  parser.add_argument("--tokens", help="a prepared token file prefix to evaluate on")
  parser.add_argument("--eval-len", type=int, default=None, help="default: 4x the training length")
  parser.add_argument("--batch-size", type=int, default=None)
  parser.add_argument("--max-sequences", type=int, default=64)
  parser.add_argument("--no-roll", action="store_true", help="do not roll sequences randomly")
  parser.add_argument("--needle", action="store_true", help="run the needle-in-a-haystack grid")
  parser.add_argument("--needle-lengths", type=int, nargs="+", default=None)
  parser.add_argument("--haystack", nargs="+", default=None, help="haystack text files (default: --data)")
  parser.add_argument("--window", type=int, default=64, help="moving-average window of the plot")
  parser.add_argument("--log-x", action="store_true")
  parser.add_argument("--out", default=None)
  args = parser.parse_args(argv)

  from lpcjax.config import ConfigError
  from lpcjax.data import DataError
  from lpcjax.evaluation import RunError, evaluate_run, write_outputs

  run_dirs = [args.run] if args.run else args.compare
  try:
    results = [evaluate_run(run, eval_len=args.eval_len, data_files=args.data, data_tokens=args.tokens,
                            batch_size=args.batch_size, max_sequences=args.max_sequences,
                            roll=not args.no_roll, needle=args.needle, needle_lengths=args.needle_lengths,
                            haystack_files=args.haystack) for run in run_dirs]
  except (RunError, DataError, ConfigError) as error:
    print(f"error: {error}", file=sys.stderr)
    return 2
  out = args.out or os.path.join(run_dirs[0], "eval")
  write_outputs(results, out, window=args.window, log_x=args.log_x)
  for r in results:
    by_length = ", ".join(f"L={k}: {v['loss']:.3f}" for k, v in r["by_context_length"].items())
    print(json.dumps({"label": r["label"], "mean_loss": r["mean_loss"], "perplexity": r["perplexity"],
                      "word_perplexity": r.get("word_perplexity"), "num_sequences": r["num_sequences"]}))
    print(f"  mean loss over the first L tokens: {by_length}")
  print(f"wrote {out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())

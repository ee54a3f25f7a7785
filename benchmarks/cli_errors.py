"""How long the command lines take to answer bad input, beside `python -c "import jax"` measured
in the same run: each case in a fresh process, its median wall time over --repeats.

The aim (issue #68) is an answer in about a second, before JAX and the model code are imported.
Every case but the last answers before JAX loads; the last, an attention backend the model
cannot use, needs the backends' table (JAX) and is answered when the run starts. Prints a table
and writes JSON.

  python benchmarks/cli_errors.py [--repeats 3] [--out benchmarks/results/cli_errors.json]
"""

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from lpcjax.files import write_json_atomic

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cases(scratch):
  """(name, argv, expected exit status): a bad override, a missing file, a run that is not there,
  an output folder with a file in its place; and the floor, JAX's import alone."""
  a_file = os.path.join(scratch, "a_file")
  open(a_file, "w").close()
  train, evaluate = [sys.executable, os.path.join(REPO, "train.py")], [sys.executable, os.path.join(REPO, "eval.py")]
  return [
      ("import jax (the floor)", [sys.executable, "-c", "import jax"], 0),
      ("train.py: an unknown override", [*train, "model.d_modle=3"], 2),
      ("train.py: a missing data file", [*train, "--config", "fox_tiny_text", "data.train_files=/missing.txt"], 2),
      ("train.py: a run folder under a file", [*train, f"train.run_dir={a_file}", "train.steps=1",
                                               "train.warmup_steps=0"], 2),
      ("train.py: lpcsm's chunks and seq_len", [*train, "--config", "lpcsm:tiny", "data.seq_len=100"], 2),
      ("train.py: a mistyped backend", [*train, "model.attention_impl=trion"], 2),
      ("eval.py: a run that is not there", [*evaluate, "--run", os.path.join(scratch, "nowhere")], 2),
      ("train.py: a backend it cannot use (JAX)", [*train, "model.attention_impl=pallas", "model.head_dim=8",
                                                   "train.steps=1", "train.warmup_steps=0",
                                                   f"train.run_dir={scratch}/runs"], 2),
  ]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "cli_errors.json"))
  args = parser.parse_args()
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
  rows = []
  with tempfile.TemporaryDirectory() as scratch:
    for name, argv, expected in cases(scratch):
      times = []
      for _ in range(args.repeats):
        start = time.perf_counter()
        result = subprocess.run(argv, capture_output=True, text=True, cwd=scratch, env=env)
        times.append(time.perf_counter() - start)
        if result.returncode != expected:
          raise SystemExit(f"{name}: exit {result.returncode}, expected {expected}: {result.stderr[-300:]}")
      line = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ""
      rows.append({"case": name, "seconds_median": statistics.median(times), "seconds": times, "stderr": line})
  floor = rows[0]["seconds_median"]
  print(f"{'case':<40} {'s (median)':>10} {'x import jax':>12}")
  for row in rows:
    print(f"{row['case']:<40} {row['seconds_median']:>10.2f} {row['seconds_median'] / floor:>12.1f}")
  write_json_atomic(args.out, {"machine": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
                               "repeats": args.repeats, "rows": rows})
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()

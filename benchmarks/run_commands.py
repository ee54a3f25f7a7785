"""Running train.py / eval.py from a benchmark driver: one subprocess each, its output in a log."""

import json
import os
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def complete(run, steps):
  """Whether run reached steps (a run stopped by a signal writes a summary too, marked preempted)."""
  path = os.path.join(run, "summary.json")
  if not os.path.exists(path):
    return False
  with open(path) as f:
    summary = json.load(f)
  return not summary["preempted"] and summary["step"] >= steps


def timed(command, log_path):
  """Runs command from the repository root, its output into log_path; seconds it took."""
  start = time.perf_counter()
  with open(log_path, "w") as log:
    status = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
  if status:
    raise SystemExit(f"exit status {status}: {' '.join(command)} (see {log_path})")
  return time.perf_counter() - start

"""Two JAX processes on localhost (2 CPU devices each) train one run, checkpoint, and a second
launch of two processes resumes it: the losses must be those of one uninterrupted process with
4 devices, and each process must read only its share of every global batch.

Every process runs tests/training/multiprocess_worker.py in a subprocess with its own XLA_FLAGS
(this pytest process has 8 devices, set by conftest). Each launch has a timeout: a hung
collective or barrier fails the test instead of blocking CI. Where the installed JAX cannot run
collectives across CPU processes, the test skips with the workers' exact error.
"""

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

WORKER = Path(__file__).with_name("multiprocess_worker.py")
LAUNCH_TIMEOUT_S = 180

# Constant learning rate after warmup (min = peak): the cosine schedule then does not depend on
# train.steps, so 6 steps plus 4 resumed ones follow the same schedule as 10 straight steps.
COMMON = ("train.log_every=1", "train.eval_batches=1", "train.checkpoint_every=3",
          "train.learning_rate=0.01", "train.min_learning_rate=0.01")


def free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def child_env(devices):
  """This environment with `devices` virtual CPU devices instead of conftest's 8."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", env.get("XLA_FLAGS", ""))
  env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
  return env


def launch(tmp_path, tag, num_processes, devices, name, *overrides, resume=False):
  """Run the worker as processes 0..num_processes-1 of one job; returns their result dicts."""
  port = free_port()
  procs = []
  for i in range(num_processes):
    log = open(tmp_path / f"{tag}-{i}.log", "w")
    cmd = [sys.executable, str(WORKER), *(["--resume"] if resume else []), str(i), str(num_processes),
           str(port), str(tmp_path / f"{tag}-{i}.json"), str(tmp_path), name, *COMMON, *overrides]
    procs.append(subprocess.Popen(cmd, env=child_env(devices), stdout=log, stderr=subprocess.STDOUT))
    log.close()

  deadline = time.monotonic() + LAUNCH_TIMEOUT_S
  try:
    # Stop at the first failure too: the other processes would wait for it until they time out.
    while any(p.poll() is None for p in procs) and not any(p.returncode for p in procs):
      if time.monotonic() > deadline:
        pytest.fail(f"{tag}: still running after {LAUNCH_TIMEOUT_S} s\n{logs(tmp_path, tag, num_processes)}")
      time.sleep(0.1)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()

  results = [json.loads(path.read_text()) if path.exists() else {}
             for path in (tmp_path / f"{tag}-{i}.json" for i in range(num_processes))]
  errors = [r["collectives_error"] for r in results if "collectives_error" in r]
  if errors:
    import jax
    pytest.skip(f"JAX {jax.__version__} cannot run cross-process CPU collectives: {errors[0]}")
  if any(p.returncode for p in procs):
    codes = [p.returncode for p in procs]
    pytest.fail(f"{tag}: exit statuses {codes}\n{logs(tmp_path, tag, num_processes)}")
  return results


def logs(tmp_path, tag, num_processes):
  return "\n".join(f"--- process {i} (last 3000 characters) ---\n"
                   + (tmp_path / f"{tag}-{i}.log").read_text()[-3000:] for i in range(num_processes))


def losses_of(run_dir):
  records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
  return [r["step"] for r in records if "loss" in r], [r["loss"] for r in records if "loss" in r]


def rows(batch):
  return sorted(map(tuple, batch))


@pytest.mark.slow  # 1-1.5 minutes on 2 cores: each of the 5 processes compiles the model
def test_two_processes_train_and_resume_like_one(tmp_path):
  first = launch(tmp_path, "first", 2, 2, "shared", "train.steps=6")  # checkpoints at 3 and 6
  resumed = launch(tmp_path, "resumed", 2, 2, "shared", "train.steps=10", resume=True)
  [reference] = launch(tmp_path, "reference", 1, 4, "reference", "train.steps=10")

  for launch_results in (first, resumed):
    assert sorted(r["process_index"] for r in launch_results) == [0, 1]
    for result in launch_results:
      assert (result["process_count"], result["local_device_count"], result["device_count"]) == (2, 2, 4)
  for result in (*first, *resumed, reference):
    assert result["summary"]["mesh"] == {"data": 4, "fsdp": 1, "context": 1, "tensor": 1}
  assert [r["summary"]["step"] for r in (*resumed, reference)] == [10, 10, 10]

  # Both processes saved their parts of checkpoints 3, 6, 9 and 10 (the last 3 are kept), and
  # process 0 logged steps 1-6, then (resumed from step 6) 7-10, each once.
  saved = {name for name in os.listdir(tmp_path / "shared" / "checkpoints") if name.isdigit()}
  assert saved == {"6", "9", "10"}
  steps, losses = losses_of(tmp_path / "shared")
  reference_steps, reference_losses = losses_of(tmp_path / "reference")
  assert steps == reference_steps == list(range(1, 11))
  # Equal to about 1 float32 ulp, not bitwise, for two reasons. Process p's share is examples
  # p, p+2, ... of the global batch, placed on its own devices, so each device holds other
  # examples than in the one-process run and sums them in another order. And even with the same
  # layout, the cross-process all-reduce (Gloo) adds the partial sums in another order than
  # the in-process one: losses then differ from step 5 on.
  np.testing.assert_allclose(losses, reference_losses, rtol=2e-5)

  # Each process's share of global batch k: half of it, disjoint from the other's, and together
  # the one-process run's batch k (the losses above show train() consumed them in order).
  for launch_results in (first, resumed):
    shares = {r["process_index"]: r["inputs"] for r in launch_results}
    for k, global_batch in enumerate(reference["inputs"][:len(shares[0])]):
      a, b = shares[0][k], shares[1][k]
      assert len(a) == len(b) == len(global_batch) // 2
      assert not set(map(tuple, a)) & set(map(tuple, b)), f"batch {k}: the processes share examples"
      assert rows(a + b) == rows(global_batch), f"batch {k}: the shares do not form the global batch"

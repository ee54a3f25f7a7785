"""One process of a multi-process run, started by tests/training/test_multiprocess.py.

    python multiprocess_worker.py [--resume] PROCESS_ID NUM_PROCESSES PORT RESULT_JSON RUN_DIR NAME
                                  [OVERRIDE ...]

With NUM_PROCESSES > 1 it joins the job coordinated on 127.0.0.1:PORT (process 0 hosts the
coordinator) and checks a cross-process collective first. It then trains
``tiny_experiment(RUN_DIR, *OVERRIDES, name=NAME)`` and writes RESULT_JSON:
process index/count, device counts, train()'s summary and the "inputs" of the first
train.steps batches this process's ``make_dataset`` yields (its share of each global batch).
If JAX cannot join the job or run the collective, RESULT_JSON holds {"collectives_error": ...}
and the exit status is UNSUPPORTED, so the test can skip with that exact error.

The device count comes from XLA_FLAGS in this process's environment (set by the test).
"""

import argparse
import json
import pathlib
import sys
import traceback

UNSUPPORTED = 3

# tests/ holds conftest.tiny_experiment: the configs are built exactly as in the other tests.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


def join_job(process_id, num_processes, port):
  """jax.distributed.initialize with CPU collectives, then one all-reduce over every process."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  # Without a CPU collectives implementation, computations spanning processes cannot run on
  # CPU. Gloo is the default on recent JAX; older releases defaulted to none.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=num_processes,
                             process_id=process_id, initialization_timeout=60)
  mesh = jax.make_mesh((jax.device_count(),), ("d",), devices=jax.devices())
  local = np.full(jax.local_device_count(), jax.process_index() + 1, np.float32)
  x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), local)
  return float(jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(x))


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("process_id", type=int)
  parser.add_argument("num_processes", type=int)
  parser.add_argument("port", type=int)
  parser.add_argument("result")
  parser.add_argument("run_dir")
  parser.add_argument("name")
  parser.add_argument("--resume", action="store_true")
  parser.add_argument("overrides", nargs="*")
  args = parser.parse_args()

  def report(result):
    with open(args.result, "w") as f:
      json.dump(result, f)

  if args.num_processes > 1:
    try:
      total = join_job(args.process_id, args.num_processes, args.port)
    except Exception as error:  # noqa: BLE001 -- any failure here means "no CPU collectives"
      traceback.print_exc()
      report({"collectives_error": f"{type(error).__name__}: {error}"})
      sys.exit(UNSUPPORTED)
    import jax
    expected = sum((p + 1) * jax.local_device_count() for p in range(args.num_processes))
    assert total == expected, f"cross-process sum gave {total}, expected {expected}"

  import jax

  from conftest import tiny_experiment
  from lpcjax.data import make_dataset
  from lpcjax.training import train

  cfg = tiny_experiment(args.run_dir, *args.overrides, name=args.name)
  _, summary = train(cfg, resume=args.resume, progress=False)
  # make_dataset with no process arguments, as train() calls it: this process's share of each
  # global batch, by jax.process_index() / jax.process_count().
  share = make_dataset(cfg.data, cfg.train.seed, "train")
  report({"process_index": jax.process_index(), "process_count": jax.process_count(),
          "local_device_count": jax.local_device_count(), "device_count": jax.device_count(),
          "summary": summary, "inputs": [share[i]["inputs"].tolist() for i in range(cfg.train.steps)]})
  if args.num_processes > 1:
    jax.distributed.shutdown()  # waits for every process, so none exits while others still need it


if __name__ == "__main__":
  main()

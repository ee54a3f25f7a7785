"""Per-device memory of a FoX training step with the sequence split over N devices (context
parallelism, train.mesh_context=N), and the longest sequence that fits a per-device budget.

Reads XLA's memory analysis of the compiled train step (arguments + outputs + temporaries,
less what the donated state aliases); nothing is run, so it works on virtual CPU devices for any
T. The batch is one sequence (mesh data 1, context N): what a user trains when a single
sequence is the unit that does not fit. Prints two tables and writes JSON.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python benchmarks/context_parallel.py \\
      [--seq-len 8192] [--devices 1 2 4 8] [--budget-mib 2048] [--out FILE]
"""

import argparse
import functools
import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from lpcjax import experiment, models  # noqa: E402
from lpcjax.sharding import make_mesh, rules_from_config  # noqa: E402
from lpcjax.training import make_optimizer, state_shardings, train_step  # noqa: E402

from results_file import write_results  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = ("model.d_model=256", "model.num_layers=4", "model.num_heads=4", "model.vocab_size=50257",
         "model.block=pro", "model.remat_policy=full")


def step_memory(seq_len, devices, model_overrides):
  """(per-device bytes of the compiled step, its temporaries) for a batch of one sequence."""
  config = experiment.apply_overrides(experiment.load_experiment(os.path.join(REPO, "configs", "fox_tiny_text.py")), [
      *model_overrides, f"data.seq_len={seq_len}", "data.batch_size=1", "train.mesh_data=1",
      f"train.mesh_context={devices}"])
  family = models.get("fox")
  model = family.build(config.model)
  mesh = make_mesh(config.train, jax.devices()[:devices])
  rules = rules_from_config(config.train)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    optimizer = make_optimizer(config.train)
    abstract, shardings = state_shardings(family, model, config, optimizer, mesh, rules)
    state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings)
    tokens = jax.ShapeDtypeStruct((1, seq_len), jnp.int32, sharding=NamedSharding(mesh, P(("data", "fsdp"), "context")))
    batch = {"inputs": tokens, "targets": tokens, "loss_mask": tokens}
    step = jax.jit(functools.partial(train_step, loss_fn=family.loss, accum_steps=1, seed=0), donate_argnums=0)
    analysis = step.lower(state, batch).compile().memory_analysis()
  total = (analysis.argument_size_in_bytes + analysis.output_size_in_bytes + analysis.temp_size_in_bytes
           - analysis.alias_size_in_bytes)
  return total, analysis.temp_size_in_bytes


def longest_fitting(devices, budget, model_overrides, start=1024, limit=1 << 22):
  """The largest T = start * 2^k whose step fits ``budget`` bytes per device."""
  best, seq_len = None, start
  while seq_len <= limit:
    total, _ = step_memory(seq_len, devices, model_overrides)
    if total > budget:
      break
    best, seq_len = seq_len, seq_len * 2
  return best


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seq-len", type=int, default=8192)
  parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 8])
  parser.add_argument("--budget-mib", type=float, default=2048.0)
  parser.add_argument("--out", default=None,
                      help="JSON path (default benchmarks/results/context_parallel_<backend>.json)")
  args = parser.parse_args()

  rows = []
  for devices in args.devices:
    total, temp = step_memory(args.seq_len, devices, MODEL)
    rows.append({"devices": devices, "seq_len": args.seq_len, "per_device_bytes": total, "temp_bytes": temp})
  base = rows[0]
  print(f"FoX Pro (d 256, 4 layers, full remat), one sequence of T = {args.seq_len}, per device:")
  print(f"{'N':>3} {'step MiB':>10} {'temp MiB':>10} {'temp x N / temp(1)':>20}")
  for row in rows:
    scaled = row["temp_bytes"] * row["devices"] / base["temp_bytes"]
    print(f"{row['devices']:>3} {row['per_device_bytes'] / 2**20:>10.1f} {row['temp_bytes'] / 2**20:>10.1f} "
          f"{scaled:>20.2f}")

  budget = int(args.budget_mib * 2**20)
  fits = {devices: longest_fitting(devices, budget, MODEL) for devices in (args.devices[0], args.devices[-1])}
  print(f"\nlongest T (powers of two from 1024) whose step fits {args.budget_mib:g} MiB per device:")
  for devices, seq_len in fits.items():
    print(f"{devices:>3} devices: T = {seq_len}")

  write_results("context_parallel", {
      "what": "XLA memory analysis of the compiled FoX train step (arguments + outputs + temporaries - aliased), "
              "per device, batch of one sequence over mesh (data 1, context N)",
      "model": list(MODEL), "rows": rows, "budget_mib": args.budget_mib,
      "longest_fitting_seq_len": {str(k): v for k, v in fits.items()},
      "command": "XLA_FLAGS=--xla_force_host_platform_device_count=8 python benchmarks/context_parallel.py"}, args.out)


if __name__ == "__main__":
  main()

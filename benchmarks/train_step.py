"""Train-step throughput: tokens (or series) per second and model FLOPs utilisation, several models in one run.

  python benchmarks/train_step.py                                  # tiny FoX vs Transformer, CPU
  python benchmarks/train_step.py --config paper:fox_pro_125m --set data.seq_len=4096 \
      data.batch_size=8 --families fox                             # the GPU figure
  python benchmarks/train_step.py --config lpcsm:tiny --families lpcsm fox,model.attention_window=None
  python benchmarks/train_step.py --config pmt:tiny --set data.train_file=Wafer_TRAIN.tsv.gz \
      --families pmt pmt,model.dropout=0,model.projection_dropout=0 --out ...   # a time-series family

A candidate is a family name, optionally followed by ``,section.field=value`` overrides for it
alone (above: FoX with full attention, where the LPC-SM config has a window). Token families
time a batch of random tokens (no data files needed); the others (PMT) the first batch of the
config's own training pipeline (read with ``train.seed``), and their throughput is in their own
unit (series/s). The step is the trainer's own (``lpcjax.training.loop.compiled_steps``: the
family's loss, ``train.grad_accum_steps``), and the rate counts what the trainer's progress bar
counts (``units_per_step``: for SITH the m predicted tokens of each window, not its length).

Each candidate (a family, on the same config otherwise) is compiled, warmed up, then timed
over --steps steps; the candidates are interleaved round by round so that load changes on a
shared machine hit them alike. Model FLOPs per token: the family's estimate
(``lpcjax.models.language_model.decoder_flops_per_token``: 6 * non-embedding params plus causal
attention 12 * layers * d_attn * the mean keys per query), the figure train.py's ``mfu`` uses.
MFU needs the device's peak: known for H100/H200 (989 TFLOP/s dense bf16) and A100
(``lpcjax.training.throughput.PEAK_TFLOPS``), else give --peak-tflops.
"""

import argparse
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from lpcjax import experiment as config_lib
from lpcjax import models
from lpcjax.data.pipeline import make_dataset
from lpcjax.files import write_json_atomic
from lpcjax.training import create_train_state
from lpcjax.training.loop import compiled_steps
from lpcjax.training.throughput import peak_flops

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def one_batch(family, config):
  """The timed batch: random tokens for a token family (no data files needed), else the first batch
  of the config's training pipeline."""
  cfg = config.data
  if family.throughput_unit == "tokens":
    rng = np.random.default_rng(0)
    tokens = lambda: jnp.asarray(rng.integers(0, config.model.vocab_size, (cfg.batch_size, cfg.seq_len)))
    return {"inputs": tokens(), "targets": tokens(), "loss_mask": jnp.ones((cfg.batch_size, cfg.seq_len), jnp.float32)}
  return jax.tree.map(jnp.asarray, next(iter(make_dataset(cfg, config.train.seed, "train").to_iter_dataset())))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="fox_tiny_mqar")
  parser.add_argument("--set", nargs="*", default=[], help="config overrides, section.field=value")
  parser.add_argument("--families", nargs="+", default=["fox", "transformer"])
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--peak-tflops", type=float, default=None)
  parser.add_argument("--out", default=None)
  args = parser.parse_args()

  base = config_lib.apply_overrides(config_lib.load_experiment(args.config, CONFIG_DIR), args.set)
  device = jax.devices()[0].device_kind
  peak = peak_flops(jax.devices()[:1], args.peak_tflops)
  peak = peak / 1e12 if peak else None  # TFLOP/s of the one device the steps run on

  candidates = {}
  for spec in args.families:
    family, *overrides = spec.split(",")
    config = config_lib.apply_overrides(base, [f"model.family={family}", *overrides])
    spec_family = models.get(family)
    model = spec_family.build(config.model)
    state = create_train_state(spec_family, model, config)
    step, _ = compiled_steps(spec_family, config, shardings=None)
    batch = one_batch(spec_family, config)
    start = time.perf_counter()
    state, metrics = step(state, batch)  # compile
    jax.block_until_ready(metrics)
    candidates[spec] = {"config": config, "state": state, "step": step, "batch": batch, "times": [],
                        "compile_s": time.perf_counter() - start, "unit": spec_family.throughput_unit,
                        "units": config.data.batch_size * spec_family.units_per_example(config),
                        "flops_per_unit": (spec_family.flops_per_unit or (lambda *_: None))(config, state.params)}
  for _ in range(args.rounds):
    for entry in candidates.values():
      start = time.perf_counter()
      for _ in range(args.steps):
        entry["state"], metrics = entry["step"](entry["state"], entry["batch"])
      jax.block_until_ready(metrics)
      entry["times"].append((time.perf_counter() - start) / args.steps)

  rows = []
  print(f"device: {device}  jax {jax.__version__}  ({args.config} {' '.join(args.set)})")
  width = max(12, *map(len, candidates))
  print(f"{'candidate':>{width}} {'compile s':>9} {'step ms':>9} {'units/s':>12} {'TFLOP/s':>9} {'MFU':>6}")
  for family, entry in candidates.items():
    step_s = statistics.median(entry["times"])
    tflops = (entry["flops_per_unit"] or float("nan")) * entry["units"] / step_s / 1e12
    row = {"family": family, "params": int(sum(np.prod(x.shape) for x in jax.tree.leaves(entry["state"].params))),
           "compile_s": entry["compile_s"], "step_ms": step_s * 1e3,
           "step_ms_rounds": [t * 1e3 for t in entry["times"]], "units_per_step": entry["units"],
           f"{entry['unit']}_per_sec": entry["units"] / step_s,
           "model_tflops": tflops, "mfu": tflops / peak if peak and entry["flops_per_unit"] else None}
    rows.append(row)
    mfu = f"{row['mfu']:.1%}" if row["mfu"] is not None else "n/a"
    rate = f"{entry['units'] / step_s:.0f} {entry['unit']}"
    print(f"{family:>{width}} {entry['compile_s']:>9.1f} {row['step_ms']:>9.1f} {rate:>12} {tflops:>9.3f} {mfu:>6}")
  if len(rows) > 1:
    ratio = rows[0]["step_ms"] / rows[1]["step_ms"]
    print(f"step time {rows[0]['family']} / {rows[1]['family']}: {ratio:.2f}")
  out = args.out or os.path.join(os.path.dirname(__file__), "results", f"train_step_{jax.default_backend()}.json")
  write_json_atomic(out, {"device": device, "jax_version": jax.__version__,
                          "python": platform.python_version(), "config": args.config,
                          "overrides": args.set, "peak_tflops": peak, "rows": rows})
  print(f"wrote {out}")


if __name__ == "__main__":
  main()

"""Train-step throughput: tokens/s and model FLOPs utilisation, several models in one run.

  python benchmarks/train_step.py                                  # tiny FoX vs Transformer, CPU
  python benchmarks/train_step.py --config paper:fox_pro_125m --set data.seq_len=4096 \
      data.batch_size=8 --families fox                             # the GPU figure
  python benchmarks/train_step.py --config lpcsm:tiny --families lpcsm fox,model.attention_window=None

A candidate is a family name, optionally followed by ``,section.field=value`` overrides for it
alone (above: FoX with full attention, where the LPC-SM config has a window).

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
from lpcjax.files import write_json_atomic
from lpcjax.training import create_train_state, train_step
from lpcjax.training.throughput import peak_flops

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


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
  rng = np.random.default_rng(0)
  cfg = base.data
  batch = {"inputs": jnp.asarray(rng.integers(0, base.model.vocab_size, (cfg.batch_size, cfg.seq_len))),
           "targets": jnp.asarray(rng.integers(0, base.model.vocab_size, (cfg.batch_size, cfg.seq_len))),
           "loss_mask": jnp.ones((cfg.batch_size, cfg.seq_len), jnp.float32)}
  device = jax.devices()[0].device_kind
  peak = peak_flops(jax.devices()[:1], args.peak_tflops)
  peak = peak / 1e12 if peak else None  # TFLOP/s of the one device the steps run on

  candidates = {}
  for spec in args.families:
    family, *overrides = spec.split(",")
    config = config_lib.apply_overrides(base, [f"model.family={family}", *overrides])
    model = models.get(family).build(config.model)
    state = create_train_state(models.get(family), model, config)
    step = jax.jit(train_step, donate_argnums=0)
    state, metrics = step(state, batch)  # compile
    jax.block_until_ready(metrics)
    candidates[spec] = {"config": config, "state": state, "step": step, "times": [],
                          "flops_per_token": (models.get(family).flops_per_unit or (lambda *_: None))(
                              config, state.params)}
  for _ in range(args.rounds):
    for entry in candidates.values():
      start = time.perf_counter()
      for _ in range(args.steps):
        entry["state"], metrics = entry["step"](entry["state"], batch)
      jax.block_until_ready(metrics)
      entry["times"].append((time.perf_counter() - start) / args.steps)

  tokens = cfg.batch_size * cfg.seq_len
  rows = []
  print(f"device: {device}  jax {jax.__version__}  batch {cfg.batch_size} x {cfg.seq_len}  "
        f"({args.config} {' '.join(args.set)})")
  print(f"{'family':>12} {'step ms':>9} {'tokens/s':>10} {'TFLOP/s':>9} {'MFU':>6}")
  for family, entry in candidates.items():
    step_s = statistics.median(entry["times"])
    tflops = (entry["flops_per_token"] or float("nan")) * tokens / step_s / 1e12
    row = {"family": family, "params": int(sum(np.prod(x.shape) for x in jax.tree.leaves(entry["state"].params))),
           "step_ms": step_s * 1e3, "tokens_per_sec": tokens / step_s,
           "model_tflops": tflops, "mfu": tflops / peak if peak and entry["flops_per_token"] else None}
    rows.append(row)
    mfu = f"{row['mfu']:.1%}" if row["mfu"] is not None else "n/a"
    print(f"{family:>12} {row['step_ms']:>9.1f} {row['tokens_per_sec']:>10.0f} {tflops:>9.3f} {mfu:>6}")
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

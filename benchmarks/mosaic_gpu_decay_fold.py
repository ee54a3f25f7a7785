"""The error of impl="mosaic_gpu" with and without its folded decay (``Version.folded_decay``,
kernels/mosaic_gpu.py): outputs and the four gradients against float64, in JAX's Mosaic GPU
interpreter (CPU, Python >= 3.12, jax >= 0.11.2), at gates from near 1 to strong and with c far
from zero.

Folded, a logit's decay is an FMA's addend measured from its block's anchor and the rest rides on
the running maximum or lse, so its rounding grows with the decay across half a block of 64
positions; unfolded, (hi_i - hi_j) + (lo_i - lo_j) rounds with |c_i - c_j| (decay.py). Both
are version 2 in every other respect; the unfolded one is registered here for the run only. So
is "folded64", folded with the forward's key tiles 64 wide (``Version.wide_forward_keys`` off):
the wide tiles measure their keys' e across half a block of 128 (docs/kernels_mosaic_gpu.md).

For each case: q, k, v, dO normal, rounded to the dtype; log f uniform in the range, log f_0
lowered by the offset (no weight changes), and in the "one step" cases one steep gate inside a
block. Error = max |x - x64| / max |x64| per array.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \\
    python benchmarks/mosaic_gpu_decay_fold.py [--seq-len 512] [--dtype float16] [--seeds 0 1 2]
"""

import argparse
import dataclasses
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from lpcjax.kernels import forgetting_attention, mosaic_gpu

from results_file import write_results

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from float64_attention import forgetting_attention_float64, long_context_inputs, relative_errors  # noqa: E402

# name: (log f range, c offset, log f at position STEEP_AT or None)
CASES = {
    "near_1": ((-0.03, 0.0), 0.0, None),
    "moderate": ((-0.1, -0.02), 0.0, None),
    "mixed": ((-1.2, 0.0), 0.0, None),
    "strong": ((-4.0, -1.0), 0.0, None),
    "strong_offset5e4": ((-4.0, -1.0), 5e4, None),
    # one steep gate inside a block, the rest near 1: the positions on its far side from the
    # block's anchor carry its whole decay in e
    "near_1_one_step_-30": ((-0.03, 0.0), 0.0, -30.0),
    "near_1_one_step_-1e3": ((-0.03, 0.0), 0.0, -1e3),
    "near_1_one_step_-1e4": ((-0.03, 0.0), 0.0, -1e4),
}
STEEP_AT = 80  # inside the block of positions 64-127, before its anchor (96)
NAMES = ("o", "dq", "dk", "dv", "dlog_f")
UNFOLDED = dataclasses.replace(mosaic_gpu.V2, name="mosaic_gpu_unfolded", folded_decay=False)
# folded, with the forward's key tiles 64 wide: its keys' e spans half a block of 64, not of 128
NARROW = dataclasses.replace(mosaic_gpu.V2, name="mosaic_gpu_narrow_keys", wide_forward_keys=False)
RUNS = (("unfolded", UNFOLDED.name), ("folded64", NARROW.name), ("folded", mosaic_gpu.V2.name))


def parse_args():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
  parser.add_argument("--seq-len", type=int, default=512)
  parser.add_argument("--head-dim", type=int, default=64, choices=mosaic_gpu.HEAD_DIMS)
  parser.add_argument("--dtype", default="float16", choices=mosaic_gpu.DTYPES)
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--out", default=None, help="JSON path (default results/mosaic_gpu_decay_fold_<backend>.json)")
  return parser.parse_args()


def errors_of(impl, inputs, dtype):
  q, k, v, log_f, do = inputs

  def loss(q, k, v, log_f):
    o = forgetting_attention(q, k, v, log_f, impl=impl, interpret=True)
    return jnp.sum(o.astype(jnp.float32) * do), o
  (_, o), grads = jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(
      *(jnp.asarray(x, dtype) for x in (q, k, v)), jnp.asarray(log_f))
  results = [np.asarray(x.astype(jnp.float32)) for x in (o, *grads)]
  return dict(zip(NAMES, relative_errors(results, forgetting_attention_float64(*inputs))))


def main():
  args = parse_args()
  if not mosaic_gpu.available():
    sys.exit("mosaic_gpu_decay_fold.py: needs jax >= 0.11.2's Mosaic GPU interpreter (Python >= 3.12)")
  mosaic_gpu._register(UNFOLDED, priority=None)
  mosaic_gpu._register(NARROW, priority=None)
  rounded = lambda x: np.asarray(jnp.asarray(x, args.dtype).astype(jnp.float32))
  table = {}
  print(f"{'case':18s} {'run':9s} " + " ".join(f"{n:>9s}" for n in NAMES) + "   (max over seeds)")
  for case in args.cases:
    gates, offset, steep = CASES[case]
    for run, impl in RUNS:
      per_seed = []
      for seed in args.seeds:
        q, k, v, log_f, do = long_context_inputs(seed, 1, args.seq_len, 1, args.head_dim, gates, offset)
        if steep is not None:
          log_f[:, STEEP_AT] = steep
        per_seed.append(errors_of(impl, (*map(rounded, (q, k, v)), log_f, rounded(do)), args.dtype))
      table.setdefault(case, {})[run] = per_seed
      worst = [max(errors[name] for errors in per_seed) for name in NAMES]
      print(f"{case:18s} {run:9s} " + " ".join(f"{e:9.2e}" for e in worst), flush=True)
  write_results("mosaic_gpu_decay_fold", {
      "measure": "max |x - x64| / max |x64| per array and seed, inputs rounded to dtype, float64 numpy truth, "
                 "JAX's Mosaic GPU interpreter",
      "cases": {name: dict(zip(("log_f_range", "c_offset", f"log_f_at_{STEEP_AT}"), CASES[name]))
                for name in args.cases},
      "seq_len": args.seq_len, "head_dim": args.head_dim, "dtype": args.dtype, "seeds": args.seeds,
      "errors": table}, args.out)


if __name__ == "__main__":
  main()

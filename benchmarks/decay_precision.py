"""float32 error of every backend against float64 at long context, before and after the
two-float decay (kernels/decay.py): outputs and the four gradients.

For each case (T, gate range, offset of c) and backend: q, k, v, dO normal float32, log f
uniform in the range, log f_0 lowered by the offset (which shifts every c and changes no
weight). Error = max |x - x64| / max |x64| for o, dq, dk, dv and d log f, against the numpy
float64 computation of tests/float64_attention.py. "before" runs with ``decay.COMPENSATED =
False``: c a float32 cumsum and c_i - c_j the difference of two float32 numbers, as every backend
computed it before (the Pallas kernels also scaled c by log2 e before subtracting, which rounded
once more: 2.0e-3 instead of 1.3e-3 at T = 1024 with the offset, issue #34); "after" is the
default. Pallas backends run interpreted off their platform: keep their T small.

  python benchmarks/decay_precision.py [--impls xla reference pallas pallas_tpu] [--out FILE]
"""

import argparse
import os
import sys

import jax
import jax.numpy as jnp

from lpcjax.kernels import BlockSizes, decay, forgetting_attention

from results_file import write_results

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from float64_attention import forgetting_attention_float64, long_context_inputs, relative_errors  # noqa: E402

# name: (seq_len, log f range, c offset, backends that run it)
CASES = {
    "T16384_strong": (16384, (-4.0, -1.0), 0.0, ("xla", "reference")),
    "T8192_strong": (8192, (-4.0, -1.0), 0.0, ("xla",)),
    "T16384_moderate": (16384, (-0.1, -0.02), 0.0, ("xla",)),
    "T1024_strong_offset5e4": (1024, (-4.0, -1.0), 5e4, ("xla", "reference", "pallas", "pallas_tpu")),
}
NAMES = ("o", "dq", "dk", "dv", "dlog_f")


def parse_args():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--impls", nargs="+", default=["xla", "reference", "pallas", "pallas_tpu"])
  parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
  parser.add_argument("--heads", type=int, default=1)
  parser.add_argument("--head-dim", type=int, default=16)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", default=None, help="JSON path (default results/decay_precision_<backend>.json)")
  return parser.parse_args()


def float32_results(impl, q, k, v, log_f, do):
  interpret = {"pallas": jax.default_backend() != "gpu",
               "pallas_tpu": jax.default_backend() != "tpu"}.get(impl, False)
  sizes = BlockSizes(256, 256) if impl == "pallas_tpu" else BlockSizes(128, 64)

  def loss(q, k, v, log_f):
    o = forgetting_attention(q, k, v, log_f, impl=impl, interpret=interpret, block_sizes=sizes)
    return jnp.sum(o * do), o
  (_, o), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))(q, k, v, log_f)
  return (o,) + tuple(grads)


def main():
  args = parse_args()
  table = {}
  print(f"{'case':24s} {'impl':11s} {'run':7s} " + " ".join(f"{n:>9s}" for n in NAMES))
  for case in args.cases:
    seq_len, gates, offset, impls = CASES[case]
    inputs = long_context_inputs(args.seed, 1, seq_len, args.heads, args.head_dim, gates, offset)
    truth = forgetting_attention_float64(*inputs)
    for impl in (i for i in args.impls if i in impls):
      for run, compensated in (("before", False), ("after", True)):
        decay.COMPENSATED = compensated
        errors = relative_errors(float32_results(impl, *inputs), truth)
        table.setdefault(case, {}).setdefault(impl, {})[run] = dict(zip(NAMES, errors))
        print(f"{case:24s} {impl:11s} {run:7s} " + " ".join(f"{e:9.2e}" for e in errors), flush=True)
  decay.COMPENSATED = True
  write_results("decay_precision", {
      "measure": "max |x - x64| / max |x64| per array, float32 inputs, float64 numpy ground truth",
      "cases": {name: dict(zip(("seq_len", "log_f_range", "c_offset"), CASES[name][:3]))
                for name in args.cases},
      "batch": 1, "heads": args.heads, "head_dim": args.head_dim, "seed": args.seed,
      "errors": table}, args.out)


if __name__ == "__main__":
  main()

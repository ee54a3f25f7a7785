"""The kernels on a real device against float64: outputs and the four gradients, compiled.

The shared test suite proves the kernels interpreted on a CPU at small shapes; this checks what
only a device shows (the compiled lowering, its tiles, its float arithmetic) at shapes up to
T = 16k with strong gates (the long-context precision of issue #34), in float32 and bfloat16,
with grouped K/V, a sliding window and packed segments. Ground truth: the float64 numpy
computation of tests/float64_attention.py on the inputs as the kernel received them (rounded to
bf16 where that is the dtype), on the host. Error = max |x - x64| / max |x64| per array; a case
passes when every array is within the dtype's limit: 1e-4 in float32 (the suite's long-context
limit), 3e-2 in bfloat16 (bf16 has 8 significant bits: 4e-3 per rounding).

A case a backend does not support (its dtype, head dim: kernels.unsupported) is skipped with
the reason. A failing or crashing case is reported and the next one runs; the JSON is written after every
case. Exit status 0 either way (the report is the result).

  python benchmarks/kernel_check.py [--impls pallas triton mosaic_gpu auto] [--out FILE]
  python benchmarks/kernel_check.py --impls xla --max-seq-len 256     # rehearsal on a CPU
"""

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from results_file import write_results

from lpcjax.kernels import forgetting_attention, unsupported

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from float64_attention import (grouped_forgetting_attention_float64, long_context_inputs,  # noqa: E402
                              relative_errors)

NAMES = ("o", "dq", "dk", "dv", "dlog_f")
LIMITS = {"float32": 1e-4, "bfloat16": 3e-2}
# name: (T, heads, kv heads, D, dtype, log f range, window, segment starts, prune_epsilon)
CASES = {
    "T16384_D128_strong_f32": (16384, 1, 1, 128, "float32", (-4.0, -1.0), None, (), None),
    "T16384_D128_strong_bf16": (16384, 1, 1, 128, "bfloat16", (-4.0, -1.0), None, (), None),
    "T16384_D64_slow_bf16": (16384, 1, 1, 64, "bfloat16", (-0.01, -0.001), None, (), None),
    "T2048_D64_gqa4_bf16": (2048, 4, 1, 64, "bfloat16", (-0.1, -0.01), None, (), None),
    "T2048_D128_window512_bf16": (2048, 2, 2, 128, "bfloat16", (-0.05, -0.005), 512, (), None),
    "T2048_D64_segments_f32": (2048, 2, 2, 64, "float32", (-0.1, -0.01), None, (700, 1500), None),
    "T1000_D128_ragged_f32": (1000, 2, 2, 128, "float32", (-0.5, -0.05), None, (), None),
    # pruning at its default epsilon on gates that let it skip most tiles: within 2 eps max|v|
    "T8192_D128_pruned_bf16": (8192, 2, 2, 128, "bfloat16", (-0.5, -0.1), None, (300,), 4.54e-5),
}


def parse_args():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--impls", nargs="+", default=["pallas", "triton", "mosaic_gpu", "auto"])
  parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
  parser.add_argument("--max-seq-len", type=int, default=None, help="cap every case's T (a CPU rehearsal)")
  parser.add_argument("--interpret", action="store_true", help="Pallas kernels interpreted (a CPU rehearsal)")
  parser.add_argument("--out", default=None, help="JSON path (default results/kernel_check_<backend>.json)")
  return parser.parse_args()


def case_inputs(seq_len, heads, kv_heads, head_dim, dtype, gates, starts):
  q, k, v, log_f, do = long_context_inputs(0, 1, seq_len, heads, head_dim, gates)
  k, v = k[:, :, :kv_heads], v[:, :, :kv_heads]
  # what the kernel gets, and the float64 truth of exactly those (rounded) values
  q, k, v, do = (np.asarray(jnp.asarray(x, dtype).astype(jnp.float32)) for x in (q, k, v, do))
  segment_ids = None
  if starts:
    segment_ids = np.zeros((1, seq_len), np.int32)
    for start in starts:
      segment_ids[:, start:] += 1
  return q, k, v, log_f, do, segment_ids


def kernel_results(impl, dtype, window, prune_epsilon, interpret, q, k, v, log_f, do, segment_ids):
  cast = lambda x: jnp.asarray(x, dtype)
  do = cast(do)

  def loss(q, k, v, log_f):
    o = forgetting_attention(q, k, v, log_f, impl=impl, segment_ids=segment_ids, window=window,
                             prune_epsilon=prune_epsilon, interpret=interpret)
    return jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32)), o
  (_, o), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))(
      cast(q), cast(k), cast(v), jnp.asarray(log_f))
  return [np.asarray(x.astype(jnp.float32)) for x in (o, *grads)]


def main():
  args = parse_args()
  rows = []
  print(f"device: {jax.devices()[0].device_kind}  jax {jax.__version__}")
  print(f"{'case':28s} {'impl':10s} " + " ".join(f"{n:>9s}" for n in NAMES) + "  verdict")
  for case in args.cases:
    seq_len, heads, kv_heads, head_dim, dtype, gates, window, starts, prune_epsilon = CASES[case]
    if args.max_seq_len:
      seq_len = min(seq_len, args.max_seq_len)
      starts = tuple(s * seq_len // CASES[case][0] for s in starts)
      window = window and max(1, window * seq_len // CASES[case][0])
    inputs = case_inputs(seq_len, heads, kv_heads, head_dim, dtype, gates, starts)
    truth = grouped_forgetting_attention_float64(*inputs, window)
    for impl in args.impls:
      row = {"case": case, "impl": impl, "seq_len": seq_len, "heads": heads, "kv_heads": kv_heads,
             "head_dim": head_dim, "dtype": dtype, "log_f_range": gates, "window": window,
             "segment_starts": list(starts), "prune_epsilon": prune_epsilon, "limit": LIMITS[dtype]}
      reason = unsupported(impl, head_dim, dtype, window, kv_group=heads // kv_heads)
      if reason:  # a backend's documented limit: not a failure
        rows.append({**row, "skipped": reason, "passed": None})
        print(f"{case:28s} {impl:10s} skipped: {reason}", flush=True)
        continue
      try:
        results = kernel_results(impl, jnp.dtype(dtype), window, prune_epsilon, args.interpret, *inputs)
        errors = relative_errors(results, truth)
        row.update(errors=dict(zip(NAMES, errors)), passed=max(errors) <= LIMITS[dtype])
        line = " ".join(f"{e:9.2e}" for e in errors) + ("  pass" if row["passed"] else "  FAIL")
      except Exception as error:  # reported; the next case runs
        row.update(error=f"{type(error).__name__}: {str(error).splitlines()[0][:300]}", passed=False)
        line = f"ERROR {row['error']}"
      rows.append(row)
      print(f"{case:28s} {impl:10s} {line}", flush=True)
      write_results("kernel_check", {"measure": "max |x - x64| / max |x64| per array", "limits": LIMITS,
                                     "rows": rows}, args.out, quiet=True)
  ran = [row for row in rows if row["passed"] is not None]
  print(f"{sum(row['passed'] for row in ran)} of {len(ran)} passed ({len(rows) - len(ran)} skipped)")


if __name__ == "__main__":
  main()

"""Compiled temporary memory of forgetting attention (forward + backward) per backend and T.

Reads XLA's memory analysis of the compiled executable; nothing is run, so this works on CPU
for any T. Prints a table and writes JSON.

  python benchmarks/attention_memory.py [--seq-lens 1024 2048 4096 8192] [--out FILE]
"""

import argparse
import os
import platform

import jax
import jax.numpy as jnp

from lpcjax.files import write_json_atomic
from lpcjax.kernels import forgetting_attention


def temp_bytes(impl, batch, seq_len, heads, head_dim, dtype):
  qkv = jax.ShapeDtypeStruct((batch, seq_len, heads, head_dim), dtype)
  gate = jax.ShapeDtypeStruct((batch, seq_len, heads), jnp.float32)
  loss = lambda q, k, v, f: forgetting_attention(q, k, v, f, impl=impl).astype(jnp.float32).sum()
  step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))
  return step.lower(qkv, qkv, qkv, gate).compile().memory_analysis().temp_size_in_bytes


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seq-lens", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
  parser.add_argument("--impls", nargs="+", default=["reference", "xla"])
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--heads", type=int, default=1)
  parser.add_argument("--head-dim", type=int, default=64)
  parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  parser.add_argument("--out", default=None,
                      help="JSON path (default benchmarks/results/attention_memory_<backend>.json)")
  args = parser.parse_args()

  rows = []
  for seq_len in args.seq_lens:
    row = {"seq_len": seq_len}
    for impl in args.impls:
      row[impl] = temp_bytes(impl, args.batch, seq_len, args.heads, args.head_dim, jnp.dtype(args.dtype))
    rows.append(row)

  print(f"{'T':>7} " + " ".join(f"{impl + ' MiB':>14}" for impl in args.impls) + "   ratio ref/xla")
  for row in rows:
    ratio = row["reference"] / row["xla"] if {"reference", "xla"} <= set(row) else float("nan")
    print(f"{row['seq_len']:>7} " + " ".join(f"{row[i] / 2**20:>14.2f}" for i in args.impls) + f"   {ratio:>8.1f}")

  result = {"device": jax.devices()[0].device_kind, "backend": jax.default_backend(),
            "jax_version": jax.__version__, "python": platform.python_version(),
            "shape": {"batch": args.batch, "heads": args.heads, "head_dim": args.head_dim, "dtype": args.dtype},
            "what": "compiled temp bytes of value_and_grad(sum(forgetting_attention))", "rows": rows}
  out = args.out or os.path.join(os.path.dirname(__file__), "results", f"attention_memory_{jax.default_backend()}.json")
  write_json_atomic(out, result)
  print(f"wrote {out}")


if __name__ == "__main__":
  main()

"""HBM that impl="pallas_tpu" spends on its position vectors, from the module lowered for TPU.

No TPU is needed: forward + backward of forgetting_attention(impl="pallas_tpu") are lowered
for the "tpu" platform (``jax.jit(f).trace(...).lower(lowering_platforms=("tpu",))``), and for
every Mosaic kernel (``tpu_custom_call``) the operands and results are read off the module.
With bf16 q, k, v every 32-bit operand of rank >= 3 is a position vector (c's two parts,
segment ids, lse, delta, dc, in whatever layout the kernel takes them); the int32 scalar-prefetch
tables (rank 1) and the bf16 q/k/v-shaped arrays are left out. Reported per kernel and for the
backward's kernels together: bytes, and bytes per (position, head) = bytes / (B * H * T).

What the figure is: the logical sizes of the arrays handed to the kernels, each counted once
per kernel call that takes it (once however many of its operands it is; the wrapper builds
them for each call, and XLA may merge identical broadcasts of two calls); a TPU layout may pad
a dim of 1 to 8 sublanes (32 B per (position, head) for a [..., 1, T] vector). It is not XLA's
buffer assignment, which needs a TPU compile (libtpu).

  python benchmarks/tpu_backward_memory.py [--batch 8 --heads 16 --seq-len 16384 --head-dim 128]
      [--label after] [--out results/tpu_backward_memory.json]

The JSON keeps one entry per --label, so a run of an earlier checkout (PYTHONPATH) adds its
"before" beside it.
"""

import argparse
import json
import os

import jax
import jax.numpy as jnp

from lpcjax.files import write_json_atomic
from lpcjax.kernels import forgetting_attention, pallas_tpu

BACKWARD = ("dkv", "dq", "row_term")


def mlir_operations(op):
  """Every operation nested inside the MLIR operation ``op``, depth first."""
  for region in op.regions:
    for block in region.blocks:
      for inner in block.operations:
        yield inner.operation
        yield from mlir_operations(inner.operation)


def parse_args():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--heads", type=int, default=16)
  parser.add_argument("--seq-len", type=int, default=16384)
  parser.add_argument("--head-dim", type=int, default=128)
  parser.add_argument("--prune-epsilon", type=float, default=None)
  parser.add_argument("--window", type=int, default=None)
  parser.add_argument("--label", default="after")
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                    "tpu_backward_memory.json"))
  return parser.parse_args()


def lowered_module(args):
  def loss(q, k, v, log_f, seg):
    o = forgetting_attention(q, k, v, log_f, segment_ids=seg, impl="pallas_tpu",
                             prune_epsilon=args.prune_epsilon, window=args.window)
    return jnp.sum(o.astype(jnp.float32))
  qkv = jax.ShapeDtypeStruct((args.batch, args.seq_len, args.heads, args.head_dim), jnp.bfloat16)
  specs = (qkv, qkv, qkv, jax.ShapeDtypeStruct((args.batch, args.seq_len, args.heads), jnp.float32),
           jax.ShapeDtypeStruct((args.batch, args.seq_len), jnp.int32))
  pallas_tpu.on_tpu = lambda: True  # lowering only; nothing runs
  grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
  return grad.trace(*specs).lower(lowering_platforms=("tpu",)).compiler_ir("stablehlo")


def _vector_bytes(value_type):
  """Bytes of a 32-bit array of rank >= 3 (a position vector), else 0."""
  from jax._src.lib.mlir import ir
  shaped = ir.RankedTensorType(value_type)
  if shaped.rank < 3 or shaped.element_type.width != 32:
    return 0
  size = 4
  for dim in shaped.shape:
    size *= dim
  return size


def kernel_rows(module):
  """(kernel name, vector bytes in, vector bytes out, their shapes) per tpu_custom_call."""
  rows = []
  for op in mlir_operations(module.operation):
    if op.name != "stablehlo.custom_call" or "tpu_custom_call" not in str(op.attributes["call_target_name"]):
      continue
    name = str(op.attributes["kernel_name"]).strip('"').removeprefix("forgetting_attention_tpu_")
    distinct = {x.get_name(): x for x in op.operands}.values()  # an array passed twice is one buffer
    ins = [(_vector_bytes(x.type), str(x.type)) for x in distinct]
    outs = [(_vector_bytes(x.type), str(x.type)) for x in op.results]
    rows.append({"kernel": name, "vector_bytes_in": sum(b for b, _ in ins),
                 "vector_bytes_out": sum(b for b, _ in outs),
                 "vector_shapes": [t for b, t in ins + outs if b]})
  return rows


def main():
  args = parse_args()
  rows = kernel_rows(lowered_module(args))
  per = args.batch * args.heads * args.seq_len
  print(f"pallas_tpu, B = {args.batch}, H = {args.heads}, T = {args.seq_len}, D = {args.head_dim}, bf16; "
        f"{args.label}")
  print(f"{'kernel':>9} {'vectors in MiB':>14} {'out MiB':>8} {'B/(pos, head)':>14}  shapes")
  for row in rows:
    total = row["vector_bytes_in"] + row["vector_bytes_out"]
    row["bytes_per_position_head"] = total / per
    print(f"{row['kernel']:>9} {row['vector_bytes_in'] / 2**20:>14.1f} {row['vector_bytes_out'] / 2**20:>8.1f} "
          f"{row['bytes_per_position_head']:>14.1f}  {sorted(set(row['vector_shapes']))}")
  backward = sum(r["vector_bytes_in"] + r["vector_bytes_out"] for r in rows if r["kernel"] in BACKWARD)
  print(f"backward kernels together: {backward / 2**30:.3f} GiB, {backward / per:.1f} B per (position, head)")
  results = json.load(open(args.out)) if os.path.exists(args.out) else {}
  results[args.label] = {"jax": jax.__version__, "batch": args.batch, "heads": args.heads,
                         "seq_len": args.seq_len, "head_dim": args.head_dim, "dtype": "bfloat16",
                         "prune_epsilon": args.prune_epsilon, "window": args.window, "kernels": rows,
                         "backward_vector_bytes": backward,
                         "backward_bytes_per_position_head": backward / per}
  write_json_atomic(args.out, results)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()

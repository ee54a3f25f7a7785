"""How many causal tiles block skipping (prune_epsilon) removes, for random gates of several
decay timescales. Pure bookkeeping (no attention is run): works on CPU at any T.

  python benchmarks/pruning.py [--seq-len 16384] [--epsilon 4.54e-5]

Gates: log f_t = log sigmoid(b + 0.5 * noise) with b set so that sigmoid(b) = exp(-1/tau): a
typical token decays by 1/e over tau steps. q and k are unit-variance normal vectors times
--qk-scale (QK-norm'd activations are O(1) per component).
"""

import argparse
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np

from lpcjax.kernels.pruning import DEFAULT_EPSILON, skipped_tile_fraction


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seq-len", type=int, default=16384)
  parser.add_argument("--head-dim", type=int, default=64)
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--block-q", type=int, default=128)
  parser.add_argument("--block-k", type=int, default=64)
  parser.add_argument("--epsilon", type=float, default=DEFAULT_EPSILON)
  parser.add_argument("--qk-scale", type=float, default=1.0)
  parser.add_argument("--timescales", type=float, nargs="+", default=[2, 32, 512, 8192, 131072])
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "pruning.json"))
  args = parser.parse_args()

  rng = np.random.default_rng(0)
  shape = (1, args.seq_len, args.heads, args.head_dim)
  q = jnp.asarray(rng.normal(size=shape) * args.qk_scale, jnp.float32)
  k = jnp.asarray(rng.normal(size=shape) * args.qk_scale, jnp.float32)
  rows = []
  print(f"T={args.seq_len} D={args.head_dim} blocks {args.block_q}x{args.block_k} epsilon={args.epsilon:.3g}")
  print(f"{'tau':>9} {'skipped tiles':>14}")
  for tau in args.timescales:
    p = math.exp(-1 / tau)
    bias = math.log(p) - math.log1p(-p)
    log_f = jax.nn.log_sigmoid(jnp.asarray(bias + 0.5 * rng.normal(size=shape[:3]), jnp.float32))
    fraction = skipped_tile_fraction(q, k, log_f, block_q=args.block_q, block_k=args.block_k,
                                     epsilon=args.epsilon)
    rows.append({"tau": tau, "skipped_fraction": fraction})
    print(f"{tau:>9g} {fraction:>14.3f}")
  with open(args.out, "w") as f:
    json.dump({**vars(args), "rows": rows}, f, indent=2)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()

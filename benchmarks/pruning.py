"""How many causal tiles block skipping (prune_epsilon) removes, for random gates of several
decay timescales and, with --run, for the gates of a trained FoX model on real text. Pure
bookkeeping (no skipped attention is run): works on CPU.

  python benchmarks/pruning.py [--seq-len 16384] [--epsilon 4.54e-5]
  python benchmarks/pruning.py --run runs/fox --tokens data/pg_valid --eval-len 16384

Random gates: log f_t = log sigmoid(b + 0.5 * noise) with b set so that sigmoid(b) = exp(-1/tau):
a typical token decays by 1/e over tau steps. q and k are unit-variance normal vectors times
--qk-scale (QK-norm'd activations are O(1) per component).

Trained gates: the run's model reads the first --eval-len tokens of --tokens; every
attention layer's q, k and log f are taken as they enter the kernel and scored per layer.
"""

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np
from attention_inputs import timescale_log_f

from lpcjax.files import write_json_atomic
from lpcjax.kernels.pruning import DEFAULT_EPSILON, skipped_tile_fraction


def parse_args():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seq-len", type=int, default=16384)
  parser.add_argument("--head-dim", type=int, default=64)
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--block-q", type=int, default=128)
  parser.add_argument("--block-k", type=int, default=64)
  parser.add_argument("--epsilon", type=float, default=DEFAULT_EPSILON)
  parser.add_argument("--qk-scale", type=float, default=1.0)
  parser.add_argument("--timescales", type=float, nargs="+", default=[2, 32, 512, 8192, 131072])
  parser.add_argument("--run", help="a FoX run directory (train.py) whose gates to score")
  parser.add_argument("--tokens", help="token file prefix (python -m lpcjax.data) for --run")
  parser.add_argument("--eval-len", type=int, default=16384, help="tokens the --run model reads")
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "pruning.json"))
  args = parser.parse_args()
  if bool(args.run) != bool(args.tokens):
    parser.error("--run and --tokens go together")
  return args


def random_gate_rows(args):
  rng = np.random.default_rng(0)
  shape = (1, args.seq_len, args.heads, args.head_dim)
  q = jnp.asarray(rng.normal(size=shape) * args.qk_scale, jnp.float32)
  k = jnp.asarray(rng.normal(size=shape) * args.qk_scale, jnp.float32)
  rows = []
  print(f"random gates: T={args.seq_len} D={args.head_dim} blocks {args.block_q}x{args.block_k} "
        f"epsilon={args.epsilon:.3g}")
  print(f"{'tau':>9} {'skipped tiles':>14}")
  for tau in args.timescales:
    log_f = jnp.asarray(timescale_log_f(rng, shape[:3], tau))
    fraction = skipped_tile_fraction(q, k, log_f, block_q=args.block_q, block_k=args.block_k,
                                     epsilon=args.epsilon)
    rows.append({"tau": tau, "skipped_fraction": fraction})
    print(f"{tau:>9g} {fraction:>14.3f}")
  return rows


def attention_inputs(run_dir, tokens_prefix, seq_len):
  """[(q, k, log_f)] per attention layer of the run's model reading seq_len real tokens."""
  from lpcjax.data.prepare import load_token_file
  from lpcjax.runs import load_run
  from lpcjax.layers import attention

  run = load_run(run_dir)
  config, model, params = run.config, run.model, run.params
  if config.model.family != "fox":
    raise SystemExit(f"error: {run_dir} is a {config.model.family!r} run; pruning needs FoX gates")
  tokens, _ = load_token_file(tokens_prefix)
  if len(tokens) < seq_len:
    raise SystemExit(f"error: {tokens_prefix} has {len(tokens)} tokens, fewer than {seq_len}")
  captured = []
  exact = attention.forgetting_attention

  def capturing(q, k, v, log_fgate, **options):
    # Inside the model's layer scan: hand each layer's inputs to the host as they are computed.
    jax.debug.callback(lambda *xs: captured.append([np.asarray(x) for x in xs]), q, k, log_fgate,
                       ordered=True)  # layer order
    return exact(q, k, v, log_fgate, **options)

  attention.forgetting_attention = capturing
  try:
    inputs = jnp.asarray(np.asarray(tokens[:seq_len], np.int32)[None])
    jax.block_until_ready(model.apply({"params": params}, inputs))
  finally:
    attention.forgetting_attention = exact
  return captured


def trained_gate_rows(args):
  layers = attention_inputs(args.run, args.tokens, args.eval_len)
  print(f"trained gates ({args.run}): T={args.eval_len} blocks {args.block_q}x{args.block_k} "
        f"epsilon={args.epsilon:.3g}")
  print(f"{'layer':>5} {'median 1/(1-f) per head':>24} {'skipped tiles per head':>28} {'mean':>8}")
  rows = []
  for layer, (q, k, log_f) in enumerate(layers):
    per_head = [skipped_tile_fraction(jnp.asarray(q[:, :, h:h + 1], jnp.float32),
                                      jnp.asarray(k[:, :, h:h + 1], jnp.float32),
                                      jnp.asarray(log_f[:, :, h:h + 1]), block_q=args.block_q,
                                      block_k=args.block_k, epsilon=args.epsilon)
                for h in range(q.shape[2])]
    timescales = np.median(-1.0 / np.expm1(np.minimum(log_f, -1e-9)), axis=(0, 1))  # 1 / (1 - f)
    rows.append({"layer": layer, "median_timescale_per_head": timescales.tolist(),
                 "skipped_fraction_per_head": per_head, "skipped_fraction": float(np.mean(per_head))})
    print(f"{layer:>5} {' '.join(f'{t:.1f}' for t in timescales):>24} "
          f"{' '.join(f'{f:.3f}' for f in per_head):>28} {np.mean(per_head):>8.3f}")
  overall = float(np.mean([row["skipped_fraction"] for row in rows]))
  print(f"{'all':>5} {'':>24} {'':>28} {overall:>8.3f}")
  return rows


def main():
  args = parse_args()
  result = {**vars(args), "rows": random_gate_rows(args)}
  if args.run:
    result["trained_rows"] = trained_gate_rows(args)
  write_json_atomic(args.out, result)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()

"""bf16 gradient with respect to log f: error against float32, before and after the recomputed
row term (kernels/row_term.py), and what the change costs in memory.

For each backend, sequence length and gate regime: q, k, v, dO in bf16 (normal), log f = log u
with u uniform in [f_min, 1); the reference is the materialized op in float32 on the same
(rounded) inputs. Error = max |d log f - reference| / max |reference| (the same measure for dq,
dk, dv). "before" runs with ``row_term.RECOMPUTE = False``: delta = rowsum(o * dO) from the bf16
output, as the official Triton kernel does; "after" recomputes delta from the tiles.

Memory: the residuals the VJP keeps (leaves of ``jax.vjp``'s function, inputs included), in
bytes per token, and XLA's compiled temp memory of jit(value_and_grad) where the backend
reports it. The price in time is two more tile products in the backward (9 instead of 7); the
wall time of jit(grad) is given where it means something (not for interpreted Pallas, which is
how Pallas runs off-GPU, slowly: keep --seq-lens small there).

  python benchmarks/bf16_grad.py [--seq-lens 256 1024] [--impls xla pallas] [--out FILE]
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from lpcjax.kernels import BlockSizes, forgetting_attention, row_term

from results_file import write_results


def parse_args():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seq-lens", type=int, nargs="+", default=[256, 1024])
  parser.add_argument("--impls", nargs="+", default=["xla", "pallas"])
  parser.add_argument("--heads", type=int, default=2)
  parser.add_argument("--head-dim", type=int, default=64)
  parser.add_argument("--f-mins", type=float, nargs="+", default=[0.3, 0.95],
                      help="gate regimes: f uniform in [f_min, 1)")
  parser.add_argument("--block", type=int, default=64, help="block_q = block_k")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", default=None, help="JSON path (default results/bf16_grad_<backend>.json)")
  return parser.parse_args()


def inputs(seed, seq_len, heads, head_dim, f_min):
  rng = np.random.default_rng(seed)
  q, k, v, do = (jnp.asarray(rng.normal(size=(1, seq_len, heads, head_dim)), jnp.bfloat16)
                 for _ in range(4))
  log_f = jnp.asarray(np.log(rng.uniform(f_min, 1.0, size=(1, seq_len, heads))), jnp.float32)
  return q, k, v, log_f, do


def attention(impl, block):
  interpret = impl == "pallas" and jax.default_backend() != "gpu"
  return lambda q, k, v, log_f: forgetting_attention(
      q, k, v, log_f, impl=impl, interpret=interpret, block_sizes=BlockSizes(block, block))


def gradients(op, q, k, v, log_f, do):
  loss = lambda *xs: jnp.sum(op(*xs).astype(jnp.float32) * do.astype(jnp.float32))
  return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(q, k, v, log_f)


def relative_errors(grads, reference):
  return {name: float(jnp.max(jnp.abs(a.astype(jnp.float32) - b)) / jnp.max(jnp.abs(b)))
          for name, a, b in zip(("dq", "dk", "dv", "dlog_f"), grads, reference)}


def residual_bytes(op, q, k, v, log_f):
  """Bytes of everything the VJP closure holds (q, k, v, log f, lse, o where kept, ...)."""
  _, vjp = jax.vjp(op, q, k, v, log_f)
  return sum(leaf.nbytes for leaf in jax.tree.leaves(vjp) if hasattr(leaf, "nbytes"))


def grad_seconds(op, q, k, v, log_f, repeats=3):
  """Best wall time of the jitted forward + backward (after compiling)."""
  loss = lambda *xs: jnp.sum(op(*xs).astype(jnp.float32))
  step = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
  jax.block_until_ready(step(q, k, v, log_f))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(step(q, k, v, log_f))
    times.append(time.perf_counter() - start)
  return min(times)


def compiled_temp_bytes(op, q, k, v, log_f):
  loss = lambda *xs: jnp.sum(op(*xs).astype(jnp.float32))
  compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3))).lower(q, k, v, log_f).compile()
  analysis = compiled.memory_analysis()
  return None if analysis is None else int(analysis.temp_size_in_bytes)


def measure(impl, seq_len, f_min, args):
  q, k, v, log_f, do = inputs(args.seed, seq_len, args.heads, args.head_dim, f_min)
  up = lambda x: x.astype(jnp.float32)
  reference = gradients(attention("reference", args.block), up(q), up(k), up(v), log_f, up(do))
  row = {"impl": impl, "seq_len": seq_len, "f_min": f_min}
  for label, recompute in (("before", False), ("after", True)):
    row_term.RECOMPUTE = recompute  # read at trace time: every jit below traces afresh
    try:
      op = attention(impl, args.block)
      row[label] = {"error": relative_errors(gradients(op, q, k, v, log_f, do), reference),
                    "residual_bytes_per_token": residual_bytes(op, q, k, v, log_f) / seq_len,
                    "compiled_temp_bytes": compiled_temp_bytes(op, q, k, v, log_f)}
      if not (impl == "pallas" and jax.default_backend() != "gpu"):  # interpreted: no speed
        row[label]["grad_seconds"] = grad_seconds(op, q, k, v, log_f)
    finally:
      row_term.RECOMPUTE = True
  return row


def main():
  args = parse_args()
  rows = [measure(impl, seq_len, f_min, args)
          for impl in args.impls for seq_len in args.seq_lens for f_min in args.f_mins]
  print(f"{'impl':>7} {'T':>6} {'f_min':>6} | {'dlogf err before':>16} {'after':>9} | "
        f"{'dq/dk/dv err after (max)':>24} | {'residual B/token before':>23} {'after':>6} | "
        f"{'temp MiB before':>15} {'after':>7} | {'grad s before':>13} {'after':>7}")
  mib = lambda x: float("nan") if x is None else x / 2**20
  for r in rows:
    b, a = r["before"], r["after"]
    other = max(a["error"][n] for n in ("dq", "dk", "dv"))
    print(f"{r['impl']:>7} {r['seq_len']:>6} {r['f_min']:>6} | {b['error']['dlog_f']:>16.2e} "
          f"{a['error']['dlog_f']:>9.2e} | {other:>24.2e} | {b['residual_bytes_per_token']:>23.0f} "
          f"{a['residual_bytes_per_token']:>6.0f} | {mib(b['compiled_temp_bytes']):>15.2f} "
          f"{mib(a['compiled_temp_bytes']):>7.2f} | {b.get('grad_seconds', float('nan')):>13.3f} "
          f"{a.get('grad_seconds', float('nan')):>7.3f}")
  write_results("bf16_grad", {
      "what": "max |grad - float32 reference| / max |reference|, bf16 q/k/v/dO; residual bytes per "
              "token of jax.vjp(forgetting_attention); compiled temp bytes of jit(value_and_grad)",
      "shape": {"batch": 1, "heads": args.heads, "head_dim": args.head_dim, "block": args.block,
                "seed": args.seed},
      "command": "python benchmarks/bf16_grad.py " + " ".join(
          [f"--seq-lens {' '.join(map(str, args.seq_lens))}", f"--impls {' '.join(args.impls)}"]),
      "rows": rows}, args.out)


if __name__ == "__main__":
  main()

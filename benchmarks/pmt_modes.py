"""PMT's two PMA execution modes, vectorized and streaming: time and compiled temporary memory of
the PMA stack (3 blocks, d 64) forward (feature extraction) and forward + backward, at several
numbers of tokens K.

Both modes compute the same function (tests/models/test_pmt.py). Windows: W = ⌊ρK⌋ (the paper's
ρ = 0.2, so W grows with K) or a fixed ``--window-tokens``, stride ⌊W/2⌋. Memory is XLA's
analysis of the compiled executable (temp bytes, besides inputs and outputs); times are the
median of ``--repeats`` runs after a warm-up, in one process so that ratios compare like with
like. Only the PMA stack is measured: the tokenizer is the same in both modes, and the
neighbourhood layers after it use a dense masked attention (O(K²), the same in both modes).

  python benchmarks/pmt_modes.py [--tokens 512 4096] [--window-tokens 0 64] [--out FILE]
"""

import argparse
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
from results_file import write_results

from lpcjax.layers.pma import PMAStack
from lpcjax.models import PMTConfig

BASE = PMTConfig(d_model=64, num_heads=4, num_blocks=3, num_slots=1, dropout=0.0)


def measure(config, batch, k, repeats):
  window, stride, _ = config.geometry(k)
  stack = PMAStack(config.pma(), config.num_blocks, window, stride)
  x = jnp.asarray(np.random.default_rng(0).normal(size=(batch, k, config.d_model)), jnp.float32)
  valid = jnp.ones((batch, k), bool)
  variables = jax.jit(stack.init)(jax.random.PRNGKey(0), x, valid)
  forward = jax.jit(lambda v, x: stack.apply(v, x, valid))
  loss = lambda params, x: sum(jnp.square(out).sum() for out in stack.apply({"params": params}, x, valid))
  gradient = jax.jit(jax.grad(loss))
  row = {}
  for name, fn, args in (("forward", forward, (variables, x)), ("gradient", gradient, (variables["params"], x))):
    compiled = fn.lower(*args).compile()
    row[f"{name}_temp_mib"] = compiled.memory_analysis().temp_size_in_bytes / 2**20
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(repeats):
      start = time.perf_counter()
      jax.block_until_ready(compiled(*args))
      times.append(time.perf_counter() - start)
    row[f"{name}_ms"] = 1000 * float(np.median(times))
  return row


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tokens", type=int, nargs="+", default=[512, 4096], help="K, tokens per series")
  parser.add_argument("--window-tokens", type=int, nargs="+", default=[0, 64], help="0: W = ⌊0.2 K⌋")
  parser.add_argument("--batch", type=int, default=4)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/pmt_modes_<backend>.json)")
  args = parser.parse_args()

  rows = []
  print(f"{'K':>6} {'W':>5} {'mode':>10} {'fwd ms':>9} {'fwd MiB':>9} {'grad ms':>9} {'grad MiB':>9}")
  for k in args.tokens:
    for window_tokens in args.window_tokens:
      for streaming in (False, True):
        config = dataclasses.replace(BASE, window_tokens=window_tokens, streaming=streaming)
        window, stride, n = config.geometry(k)
        row = {"tokens": k, "window": window, "stride": stride, "windows": n,
               "mode": "streaming" if streaming else "vectorized", **measure(config, args.batch, k, args.repeats)}
        rows.append(row)
        print(f"{k:>6} {window:>5} {row['mode']:>10} {row['forward_ms']:>9.1f} "
              f"{row['forward_temp_mib']:>9.1f} {row['gradient_ms']:>9.1f} {row['gradient_temp_mib']:>9.1f}")
  write_results("pmt_modes", {"batch": args.batch, "model": dataclasses.asdict(BASE), "rows": rows}, args.out)


if __name__ == "__main__":
  main()

"""Decoding memory and speed of FoX with grouped-query attention: HQ/H = 1 (multi-head) and 4.

One process, one tiny FoX model shape (8 query heads of 16; d_model 128, 4 layers), the same
prompt for every variant: prefill a ``--prompt-len`` prompt (4096 by default), then time
``--new-tokens`` cached greedy decode steps (``lpcjax.decoding``'s on-device loop, after a
warm-up), the variants' timings interleaved round by round (``--rounds``, the best of each kept)
so that a change in the machine's load hits them alike. Memory: the decoding cache's bytes (k,
v at the key/value heads, c per query head, per layer, plus the row state) for prompt + new
tokens, and XLA's compiled temp bytes of the decode loop (``memory_analysis``). Random weights: speed does not
depend on them. The point is the ratio between the rows of one run, not the absolute figures.

  python benchmarks/decode_gqa.py [--prompt-len 4096] [--new-tokens 32] [--groups 1 4] [--out FILE]
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from results_file import write_results

from lpcjax import models
from lpcjax.decoding import GREEDY, _decode_jit, _prefill_jit

SIZES = dict(vocab_size=50257, d_model=128, num_layers=4, num_heads=8, mlp_multiple_of=64, tie_embeddings=True,
             attention_impl="xla")


def seconds(fn):
  start = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - start


def prepare(group, prompt_len, new_tokens):
  """(the row's figures but its speed, the decode loop to time), compiled and warmed up."""
  family = models.get("fox")
  config = family.config_cls(**SIZES, num_kv_heads=SIZES["num_heads"] // group)
  model = family.build(config)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))
  max_len = prompt_len + new_tokens
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 50257, (1, prompt_len)), jnp.int32)
  lengths = jnp.asarray([prompt_len], jnp.int32)
  key = jax.random.PRNGKey(0)
  first, cache = _prefill_jit(model, family.init_cache, GREEDY, max_len, params, tokens, None, lengths, key)
  steps = jnp.int32(new_tokens)
  decode = lambda: _decode_jit(model, GREEDY, None, None, params, cache, first, key, steps)[0]
  compiled = _decode_jit.lower(model, GREEDY, None, None, params, cache, first, key, steps).compile()
  memory = compiled.memory_analysis()
  kv_bytes = sum(cache["layers"][name].nbytes for name in ("k", "v"))
  jax.block_until_ready(decode())  # warm-up
  return {"group": group, "num_heads": config.num_heads, "num_kv_heads": config.resolved_kv_heads,
          "prompt_len": prompt_len, "new_tokens": new_tokens,
          "cache_bytes": sum(a.nbytes for a in jax.tree.leaves(cache)), "kv_cache_bytes": kv_bytes,
          "decode_temp_bytes": memory.temp_size_in_bytes,
          "decode_output_bytes": memory.output_size_in_bytes}, decode


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--prompt-len", type=int, default=4096)
  parser.add_argument("--new-tokens", type=int, default=32)
  parser.add_argument("--groups", type=int, nargs="+", default=[1, 4], help="HQ/H of each row")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/decode_gqa_<backend>.json)")
  args = parser.parse_args()

  prepared = [prepare(group, args.prompt_len, args.new_tokens) for group in args.groups]
  best = [float("inf")] * len(prepared)
  for _ in range(args.rounds):
    for i, (_, decode) in enumerate(prepared):
      best[i] = min(best[i], seconds(decode))
  rows = [dict(row, decode_s=s, tokens_per_s=args.new_tokens / s) for (row, _), s in zip(prepared, best)]
  print(f"{'HQ/H':>5} {'kv heads':>9} {'cache MiB':>10} {'k,v MiB':>8} {'decode temp MiB':>16} {'tok/s':>8}")
  for group, row in zip(args.groups, rows):
    mib = lambda b: b / 2**20
    print(f"{group:>5} {row['num_kv_heads']:>9} {mib(row['cache_bytes']):>10.2f} {mib(row['kv_cache_bytes']):>8.2f} "
          f"{mib(row['decode_temp_bytes']):>16.2f} {row['tokens_per_s']:>8.1f}")
  base = rows[0]
  for row in rows:
    row["cache_ratio"] = base["cache_bytes"] / row["cache_bytes"]
    row["speedup"] = row["tokens_per_s"] / base["tokens_per_s"]
  write_results("decode_gqa", {"model": SIZES, "batch": 1, "rounds": args.rounds, "rows": rows}, args.out)


if __name__ == "__main__":
  main()

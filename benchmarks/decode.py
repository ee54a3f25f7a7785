"""Cached decoding against recomputing the full forward pass for every new token.

For each prompt length P: the time of ``--new-tokens`` cached decode steps (the on-device loop
of ``lpcjax.decoding``, after prefill) and of as many full forward passes over the padded
sequence (P + new tokens, one compiled shape: what decoding without a cache costs), both greedy,
after a warm-up, in one process; and the cache's memory per token (keys, values and, for FoX,
the running sum of log f, per layer, plus the segment id). Random weights: speed does not
depend on them.

  python benchmarks/decode.py [--prompt-lens 256 1024 4096] [--new-tokens 16] [--out FILE]
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from results_file import write_results

from lpcjax import models
from lpcjax.decoding import GREEDY, _decode_jit, _prefill_jit

SIZES = dict(vocab_size=50257, d_model=128, num_layers=4, num_heads=4, mlp_multiple_of=64, tie_embeddings=True)


def cache_bytes_per_token(family, config, max_len=1024):
  cache = family.init_cache(config, 1, max_len)
  per_position = sum(a.nbytes for a in jax.tree.leaves(cache["layers"]) if a.ndim >= 3 and a.shape[2] == max_len)
  return (per_position + cache["segments"].nbytes) / max_len


def timed(fn, *args):
  jax.block_until_ready(fn(*args))  # compile and warm up
  start = time.perf_counter()
  jax.block_until_ready(fn(*args))
  return time.perf_counter() - start


def measure(family, model, params, prompt_len, new_tokens):
  max_len = prompt_len + new_tokens
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 50257, (1, prompt_len)), jnp.int32)
  lengths = jnp.asarray([prompt_len], jnp.int32)
  key = jax.random.PRNGKey(0)
  prefill = lambda: _prefill_jit(model, family.init_cache, GREEDY, max_len, params, tokens, None, lengths, key)
  first, cache = prefill()
  decode = lambda: _decode_jit(model, GREEDY, None, None, params, cache, first, key, jnp.int32(new_tokens))[0]
  padded = jnp.zeros((1, max_len), jnp.int32).at[:, :prompt_len].set(tokens)
  forward = jax.jit(lambda p, x: jnp.argmax(model.apply(p, x)[0, prompt_len - 1]))
  recompute = lambda: [forward(params, padded) for _ in range(new_tokens)][-1]
  prefill_s, decode_s, recompute_s = timed(prefill), timed(decode), timed(recompute)
  return {"prompt_len": prompt_len, "new_tokens": new_tokens, "prefill_s": prefill_s,
          "cached_tokens_per_s": new_tokens / decode_s, "recompute_tokens_per_s": new_tokens / recompute_s,
          "speedup": recompute_s / decode_s}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--prompt-lens", type=int, nargs="+", default=[256, 1024, 4096])
  parser.add_argument("--new-tokens", type=int, default=16)
  parser.add_argument("--families", nargs="+", default=["fox", "transformer"])
  parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/decode_<backend>.json)")
  args = parser.parse_args()

  rows = []
  print(f"{'family':>12} {'prompt':>7} {'cached tok/s':>13} {'recompute tok/s':>16} {'speed-up':>9} "
        f"{'cache B/token':>14}")
  for name in args.families:
    family = models.get(name)
    config = family.config_cls(**SIZES)
    model = family.build(config)
    params = jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))
    per_token = cache_bytes_per_token(family, config)
    for prompt_len in args.prompt_lens:
      row = {"family": name, "cache_bytes_per_token": per_token, **measure(family, model, params, prompt_len,
                                                                            args.new_tokens)}
      rows.append(row)
      print(f"{name:>12} {prompt_len:>7} {row['cached_tokens_per_s']:>13.1f} {row['recompute_tokens_per_s']:>16.2f} "
            f"{row['speedup']:>8.1f}x {per_token:>14.0f}")
  write_results("decode", {"model": SIZES, "batch": 1, "rows": rows}, args.out)


if __name__ == "__main__":
  main()

"""Cached decoding against recomputing the forward pass for every new token.

For each prompt length P: the time of ``--new-tokens`` cached decode steps (the on-device loop
of ``lpcjax.decoding``, after prefill) and of ``--recompute-tokens`` forward passes without a
cache (one compiled shape, so the rate per token does not depend on how many are timed; each
computes the logits of every position it reads, as the model's forward does), both greedy,
after a warm-up (decoding: the fastest of 3 runs), in one process; and the cache's size. Random weights: speed does not
depend on them.

What a forward without a cache reads: FoX and the Transformer the padded sequence (P + new
tokens); LPC-SM the same, padded to whole chunks (its memories write chunks); SITH the one
window of H + m tokens that holds the new token (it reads no further back: ``windowed_logits``).
FoX's cache grows with the sequence (keys, values, log f per token); LPC-SM's (window, memories,
chunk buffer) and SITH's (last H tokens, the L slots' and the chunk's keys and values) do not.

  python benchmarks/decode.py [--families fox transformer] [--prompt-lens 256 1024 4096] [--new-tokens 16]
  python benchmarks/decode.py --families lpcsm sith --prompt-lens 1024 4096 --new-tokens 64 \\
      --out benchmarks/results/decode_recurrent_cpu.json
  python benchmarks/decode.py --config paper:fox_pro_125m --families fox --prompt-lens 4096 32768 \\
      --batch-sizes 1 16 --new-tokens 64 --recompute-tokens 0      # the GPU figure: FoX (Pro) 125M

--config takes the model of an experiment config (its family replaced by each of --families)
instead of the small sizes below; tokens/s counts every row of the batch.
"""

import argparse
import dataclasses
import itertools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from results_file import write_results

from lpcjax import experiment as config_lib
from lpcjax import models
from lpcjax.decoding import GREEDY, _decode_jit, _prefill_jit
from lpcjax.models.sith import history_fill

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
SIZES = dict(vocab_size=50257, d_model=128, num_layers=4, num_heads=4)
FAMILY_SIZES = {
    "fox": dict(mlp_multiple_of=64, tie_embeddings=True),
    "transformer": dict(mlp_multiple_of=64, tie_embeddings=True),
    # the 158M model's chunk and window, at this width
    "lpcsm": dict(mlp_multiple_of=64, attention_window=256, chunk_size=64, memory_dim=128, attention_impl="xla"),
    # L = 37 slots compress H = 512 tokens (sith:L37's filters), chunks of m = 64
    "sith": dict(mlp_dim=512, num_filters=37, chunk_len=64),
}


def cache_bytes(family, config, max_len):
  return sum(a.nbytes for a in jax.tree.leaves(family.init_cache(config, 1, max_len)))


def timed(fn, repeats=1):
  """The fastest of ``repeats`` runs after a warm-up (the least disturbed by other jobs)."""
  jax.block_until_ready(fn())  # compile and warm up
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return min(times)


def forward_without_cache(name, model, prompt_len, new_tokens):
  """(the length of the sequence it takes, fn(params, tokens) -> the greedy token after P)."""
  config = model.config
  if name == "sith":  # the window of the token at P: its chunk [c, c + m) and the H tokens before
    start = prompt_len // config.chunk_len * config.chunk_len

    def window_forward(params, tokens):
      fill = jnp.full((tokens.shape[0], config.history_len), history_fill(config), tokens.dtype)
      padded = jnp.concatenate([fill, tokens], axis=1)
      window = padded[:, start:start + config.window_len]  # padded position start = sequence position start - H
      return jnp.argmax(model.apply(params, window)[:, prompt_len - start], axis=-1)

    return start + config.chunk_len, window_forward
  length = prompt_len + new_tokens
  if name == "lpcsm":
    length = -(-length // config.chunk_size) * config.chunk_size
  return length, lambda p, x: jnp.argmax(model.apply(p, x)[:, prompt_len - 1], axis=-1)


def measure(family, model, params, prompt_len, new_tokens, recompute_tokens, batch=1):
  max_len = prompt_len + new_tokens
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 50257, (batch, prompt_len)), jnp.int32)
  lengths = jnp.full((batch,), prompt_len, jnp.int32)
  key = jax.random.PRNGKey(0)
  prefill = lambda: _prefill_jit(model, family.init_cache, family.prefill, GREEDY, max_len, None, None, params,
                                 tokens, None, lengths, key)
  first, cache = prefill()
  decode = lambda: _decode_jit(model, GREEDY, None, None, max_len, None, params, cache, first, key,
                               jnp.int32(new_tokens))[0]
  prefill_s, decode_s = timed(prefill), timed(decode, repeats=3)
  cached = batch * new_tokens / decode_s
  row = {"batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens, "recompute_tokens": recompute_tokens,
         "prefill_s": prefill_s, "cached_tokens_per_s": cached, "recompute_tokens_per_s": None, "speedup": None,
         "cache_bytes": batch * cache_bytes(family, model.config, max_len)}
  if recompute_tokens:  # (the forward computes every position's logits: [B, T, vocab] floats)
    length, forward = forward_without_cache(family.name, model, prompt_len, new_tokens)
    padded = jnp.zeros((batch, max(length, prompt_len)), jnp.int32).at[:, :prompt_len].set(tokens)
    forward = jax.jit(forward)
    uncached = batch * recompute_tokens / timed(lambda: [forward(params, padded) for _ in range(recompute_tokens)][-1])
    row.update(recompute_tokens_per_s=uncached, speedup=cached / uncached)
  return row


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--prompt-lens", type=int, nargs="+", default=[256, 1024, 4096])
  parser.add_argument("--new-tokens", type=int, default=16)
  parser.add_argument("--recompute-tokens", type=int, default=None,
                      help="forwards timed (default: --new-tokens; 0: none, only cached decoding)")
  parser.add_argument("--families", nargs="+", default=["fox", "transformer"], choices=sorted(FAMILY_SIZES))
  parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1])
  parser.add_argument("--config", default=None, help="an experiment config whose model to decode (e.g. "
                      "paper:fox_pro_125m) instead of the small sizes")
  parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/decode_<backend>.json)")
  args = parser.parse_args()

  rows, sizes = [], {}
  print(f"{'family':>12} {'batch':>5} {'prompt':>7} {'cached tok/s':>13} {'recompute tok/s':>16} {'speed-up':>9} "
        f"{'prefill s':>10} {'cache MiB':>10}")
  for name in args.families:
    family = models.get(name)
    if args.config:
      config = config_lib.apply_overrides(config_lib.load_experiment(args.config, CONFIG_DIR),
                                          [f"model.family={name}"]).model
      sizes[name] = dataclasses.asdict(config)
    else:
      sizes[name] = {**SIZES, **FAMILY_SIZES[name]}
      config = family.config_cls(**sizes[name])
    model = family.build(config)
    example = jnp.zeros((1, getattr(config, "window_len", 64)), jnp.int32)
    params = jax.jit(model.init)(jax.random.PRNGKey(0), example)
    recompute = args.new_tokens if args.recompute_tokens is None else args.recompute_tokens
    for batch, prompt_len in itertools.product(args.batch_sizes, args.prompt_lens):
      try:
        row = {"family": name, **measure(family, model, params, prompt_len, args.new_tokens, recompute, batch)}
      except Exception as error:  # a size that does not fit is reported; the next one runs
        row = {"family": name, "batch": batch, "prompt_len": prompt_len,
               "error": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
        print(f"{name:>12} {batch:>5} {prompt_len:>7}   {row['error']}", flush=True)
      else:
        uncached = row["recompute_tokens_per_s"]
        print(f"{name:>12} {batch:>5} {prompt_len:>7} {row['cached_tokens_per_s']:>13.1f} "
              + (f"{uncached:>16.2f} {row['speedup']:>8.1f}x " if uncached else f"{'-':>16} {'-':>9} ")
              + f"{row['prefill_s']:>10.2f} {row['cache_bytes'] / 2**20:>10.2f}", flush=True)
      rows.append(row)
      figures = {"models": sizes, "config": args.config, "rows": rows}
      path = write_results("decode", figures, args.out, quiet=True)  # row by row: a timeout keeps the rows done
  print(f"wrote {path}")


if __name__ == "__main__":
  main()

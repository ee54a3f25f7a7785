"""The two caches of ``ForgettingAttention`` (``lpcjax.layers.attention``): their layouts, empty
caches, and what the layer writes into them outside the decode-time kernels (those sit in
``lpcjax.kernels.decode``: ``cached_attention``, ``window_chunk_attention``).

The decoding cache: k, v [batch, max_len, kv_heads, head_dim] (after KV-shift, QK-norm and RoPE;
the key/value heads only, G times fewer than the query heads with grouped-query attention), with
a forget gate c [batch, max_len, heads] float32 (per query head) = cumsum of log f over the row
(c_i - c_j is the decay between two positions of one segment; without a gate it is 0 and not
stored) with its low part c_lo (c = c + c_lo exactly, lpcjax.kernels.decay: a float32 c alone
would put an error of ~1e-3 into every decay at |c| ~ 4e4), and with KV-shift the last unshifted
k, v [batch, kv_heads, head_dim]. The model's ``context`` gives each row's ``lengths`` (prefill:
the prompt length; decoding: the new token's position), ``rope_start`` and ``segments``
[batch, max_len].

The window cache: the last window − 1 keys and values of the stream (after RoPE at their
absolute positions), their c (cumulative log f of the stream, float32, with its low part c_lo
as in the decoding cache; zeros without a gate), whether each slot holds a real token yet, and
the stream's running c after its last token (c_last, c_last_lo).
"""

import flax.linen as nn
import jax.numpy as jnp

from lpcjax.kernels import decay

from .common import dtype_of

CACHE_AXES = ("activation_batch", "activation_length", "activation_heads", "activation_head_dim")


# ----------------------------------------------------------------------------- decoding cache


def init_layer_cache(cfg, batch, max_len):
  """An empty cache (zeros, in the compute dtype) for one ``ForgettingAttention(cfg)`` layer,
  cfg an ``AttentionConfig``."""
  heads, kv_heads, head_dim, dtype = cfg.num_heads, cfg.kv_heads, cfg.head_dim, dtype_of(cfg.dtype)
  cache = {"k": jnp.zeros((batch, max_len, kv_heads, head_dim), dtype),
           "v": jnp.zeros((batch, max_len, kv_heads, head_dim), dtype)}
  if cfg.gate is not None:
    cache["c"] = jnp.zeros((batch, max_len, heads), jnp.float32)
    cache["c_lo"] = jnp.zeros((batch, max_len, heads), jnp.float32)
  if cfg.use_kv_shift:
    cache.update(k_prev=jnp.zeros((batch, kv_heads, head_dim), dtype),
                 v_prev=jnp.zeros((batch, kv_heads, head_dim), dtype))
  return cache


def constrained(cache):
  """The cache with its k, v on the layer's logical axes (``CACHE_AXES``)."""
  return {**cache, "k": nn.with_logical_constraint(cache["k"], CACHE_AXES),
          "v": nn.with_logical_constraint(cache["v"], CACHE_AXES)}


def prefilled_cache(cache, k, v, log_fgate, context):
  """The empty cache with the prompt's k, v and c at positions [0, prompt_len)."""
  length = k.shape[1]
  cache = {**cache, "k": cache["k"].at[:, :length].set(k.astype(cache["k"].dtype)),
           "v": cache["v"].at[:, :length].set(v.astype(cache["v"].dtype))}
  if "c" in cache:
    c = decay.cumsum(log_fgate, axis=1)
    cache["c"] = cache["c"].at[:, :length].set(c.hi)
    cache["c_lo"] = cache["c_lo"].at[:, :length].set(c.lo)
  return constrained(cache)


def last_candidates(candidates, lengths, decoding):
  """KV-shift state after this call: the unshifted k, v of each row's last token."""
  k, v = candidates
  if decoding:
    return {"k_prev": k[:, 0], "v_prev": v[:, 0]}
  index = (lengths - 1)[:, None, None, None]
  return {"k_prev": jnp.take_along_axis(k, index, axis=1)[:, 0], "v_prev": jnp.take_along_axis(v, index, axis=1)[:, 0]}


# ----------------------------------------------------------------------------- window cache


def init_window_cache(cfg, batch):
  """An empty window cache of ``ForgettingAttention(cfg)`` (``cfg.window`` set) for ``batch``
  streams."""
  if cfg.window is None:
    raise ValueError("a window cache needs AttentionConfig.window")
  size, dtype = cfg.window - 1, dtype_of(cfg.dtype)
  return {"k": jnp.zeros((batch, size, cfg.kv_heads, cfg.head_dim), dtype),
          "v": jnp.zeros((batch, size, cfg.kv_heads, cfg.head_dim), dtype),
          "c": jnp.zeros((batch, size, cfg.num_heads), jnp.float32),
          "c_lo": jnp.zeros((batch, size, cfg.num_heads), jnp.float32),
          "valid": jnp.zeros((batch, size), bool), "c_last": jnp.zeros((batch, cfg.num_heads), jnp.float32),
          "c_last_lo": jnp.zeros((batch, cfg.num_heads), jnp.float32)}


def is_window_cache(cache):
  """Whether ``cache`` is a window cache (``init_window_cache``), not a decoding cache."""
  return "valid" in cache

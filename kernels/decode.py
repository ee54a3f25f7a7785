"""Decoding-time forgetting attention: a few queries over cached keys, with the logits formed.

The parallel pass runs ``forgetting_attention`` (O(T) memory, a kernel); decoding attends from
one token (``cached_attention``, over a decoding cache) or one chunk of a stream
(``window_chunk_attention``, over a rolling window cache) to at most the cache's length of
keys, where forming the logits is cheapest. The cache layouts are the attention layer's
(``lpcjax.layers.attention``: ``init_layer_cache``, ``init_window_cache``).

Grouped-query attention (gqa.py): the caches hold k, v at the key/value heads only (H of the
HQ query heads: the cache is G = HQ / H times smaller) and c per query head; each query head
attends over its group's shared cached head.
"""

import jax
import jax.numpy as jnp

from . import decay
from .gqa import grouped, ungrouped


def cached_attention(q, k, v, log_fgate, cache, context, window=None, constrain=lambda cache: cache):
  """One new token per row (q, k, v [batch, 1, heads, head_dim]) at position p = lengths: write
  it into the cache, then attend over positions p - window < j <= p of its segment with logits
  q.k_j / sqrt(D) + c_p - c_j, in float32. Returns (o [batch, 1, heads, head_dim], cache).
  ``constrain(cache)``: the caller's sharding of the written cache (the layer's logical axes)."""
  position = context["lengths"]
  max_len = cache["k"].shape[1]
  # one row at a time, in place: the step writes O(1) positions, not the whole cache
  write = jax.vmap(lambda row, new, p: jax.lax.dynamic_update_slice_in_dim(row, new.astype(row.dtype), p, axis=0))
  cache = {**cache, "k": write(cache["k"], k, position), "v": write(cache["v"], v, position)}
  query_key_c = ()
  if "c" in cache:
    previous = lambda c: jnp.take_along_axis(c, jnp.maximum(position - 1, 0)[:, None, None], axis=1)
    c_new = decay.add(decay.TwoFloat(previous(cache["c"]), previous(cache["c_lo"])),
                      decay.lift(log_fgate))  # [batch, 1, heads], exact to ~u^2 |c|
    cache["c"], cache["c_lo"] = write(cache["c"], c_new.hi, position), write(cache["c_lo"], c_new.lo, position)
    query_key_c = (c_new, decay.TwoFloat(cache["c"], cache["c_lo"]))
  cache = constrain(cache)
  segments = context["segments"]
  current = jnp.take_along_axis(segments, position[:, None], axis=1)
  visible = (jnp.arange(max_len)[None, :] <= position[:, None]) & (segments == current)  # [batch, max_len]
  if window is not None:
    visible = visible & (jnp.arange(max_len)[None, :] > position[:, None] - window)
  o = materialized_attention(q, cache["k"], cache["v"], visible[:, None, :], *query_key_c)
  return o, cache


def materialized_attention(q, k, v, visible, query_c=None, key_c=None):
  """Softmax attention of a few queries over cached keys, in float32, with the logits formed.

  q [batch, Tq, heads, D]; k, v [batch, S, kv_heads, D] (kv_heads dividing heads: query head h
  reads head h // (heads / kv_heads), gqa.py); visible [batch, Tq, S] bool; query_c
  [batch, Tq, heads] and key_c [batch, S, heads] the cumulative log f of each (None: no gate),
  float32 arrays or ``lpcjax.kernels.decay.TwoFloat`` pairs (c_i − c_j is then formed from the
  two parts). Logits q.k_j / sqrt(D) + (c_i − c_j) where visible, −inf elsewhere; every query must see at
  least one key. Returns o [batch, Tq, heads, D] in q.dtype. This is the decoding-time path of
  both caches; the parallel pass runs ``lpcjax.kernels.forgetting_attention``."""
  scale = 1.0 / jnp.sqrt(jnp.float32(q.shape[-1]))
  kv_heads = k.shape[2]
  logits = jnp.einsum("bihgd,bjhd->bhgij", grouped(q.astype(jnp.float32), kv_heads, 2), k.astype(jnp.float32))
  logits = ungrouped(logits, 1) * scale  # [batch, heads, Tq, S]
  if query_c is not None:
    row = lambda c: jnp.swapaxes(c, 1, 2)[..., :, None]
    col = lambda c: jnp.swapaxes(c, 1, 2)[..., None, :]
    logits = logits + decay.difference(decay.tree_map(row, query_c), decay.tree_map(col, key_c))
  weights = jax.nn.softmax(jnp.where(visible[:, None], logits, -jnp.inf), axis=-1)
  o = jnp.einsum("bhgij,bjhd->bihgd", grouped(weights, kv_heads, 1), v.astype(jnp.float32))
  return ungrouped(o, 2).astype(q.dtype)


def window_chunk_attention(q, k, v, log_fgate, cache):
  """The chunk's queries over [cached keys ; chunk keys] -> (o, the cache rolled forward).

  Key j of that concatenation is w − 1 − j positions before the chunk's first token, so query i
  sees it iff i <= j <= i + w − 1 (causal and inside the window) and it holds a real token."""
  size, chunk = cache["k"].shape[1], q.shape[1]
  c_last = decay.TwoFloat(cache["c_last"][:, None], cache["c_last_lo"][:, None])
  c = decay.add(c_last, decay.cumsum(log_fgate, axis=1))  # [batch, chunk, heads], two parts
  keys = jnp.concatenate([cache["k"], k.astype(cache["k"].dtype)], axis=1)
  values = jnp.concatenate([cache["v"], v.astype(cache["v"].dtype)], axis=1)
  key_c = decay.TwoFloat(jnp.concatenate([cache["c"], c.hi], axis=1),
                         jnp.concatenate([cache["c_lo"], c.lo], axis=1))
  valid = jnp.concatenate([cache["valid"], jnp.ones(q.shape[:2], bool)], axis=1)
  i, j = jnp.arange(chunk)[:, None], jnp.arange(size + chunk)[None, :]
  visible = (j >= i) & (j <= i + size) & valid[:, None, :]  # [batch, chunk, keys]
  o = materialized_attention(q, keys, values, visible, c, key_c)
  keep = slice(chunk, None)  # roll: the last window − 1 positions stay
  return o, {"k": keys[:, keep], "v": values[:, keep], "c": key_c.hi[:, keep], "c_lo": key_c.lo[:, keep],
             "valid": valid[:, keep], "c_last": c.hi[:, -1], "c_last_lo": c.lo[:, -1]}

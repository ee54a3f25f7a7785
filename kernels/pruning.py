"""Block skipping for decayed tiles (the FoX authors' Adaptive Computation Pruning idea).

For a tile of query rows I and key columns J, every logit obeys

    s_ij = scale * q_i.k_j + c_i - c_j <= scale * Q * K + max_I c - min_J c,

with Q, K the largest query and key norms of that (batch, head), while the log-normalizer of
row i is at least its diagonal logit, lse_i >= s_ii >= -scale * Q * K. So the softmax weight
of any key is at most exp(2 * scale * Q * K + max_I c - min_J c), and a row's total weight on
all skipped keys (fewer than T of them) is below epsilon whenever every skipped tile has

    max_I c - min_J c < delta = log(epsilon) - 2 * scale * Q * K - log(T).

Skipping renormalizes the row over the kept keys; with W < epsilon the skipped weight, each
output component moves by at most W * (max v - min v) < 2 * epsilon * max|v|. The backward
passes skip tiles by the same rule; with the same tile sizes as the forward they skip the same
tiles (gradients exact for the pruned function), with their own sizes they skip a slightly
different set, each weight they drop again below epsilon. A tile that
contains a diagonal element is never skipped (there max_I c - min_J c >= 0 > delta).
"""

import math

import jax.numpy as jnp
from jax import lax

from . import decay
from .gqa import group_size, per_query_head

DEFAULT_EPSILON = math.exp(-10)


def skip_threshold(q, k, sm_scale, epsilon, axis_name=None):
  """delta per (batch, query head), float32 [batch, heads], for q [batch, seq, heads, head_dim]
  and k [batch, seq, kv_heads, head_dim] (grouped-query: each query head takes the norm of the
  key/value head it reads).

  ``axis_name``: the mesh axis the sequence is sharded over (inside ``shard_map``), or None.
  With it, Q, K and T are those of the whole sequence (a max over the shards), so every shard
  skips by the same bound as one device would."""
  norm = lambda x: jnp.sqrt(jnp.max(jnp.sum(jnp.square(x.astype(jnp.float32)), axis=-1), axis=1))
  q_norm, seq_len = norm(q), q.shape[1]
  k_norm = per_query_head(norm(k), group_size(q.shape[2], k.shape[2]), axis=1)
  if axis_name is not None:
    q_norm, k_norm = lax.pmax(q_norm, axis_name), lax.pmax(k_norm, axis_name)
    seq_len *= lax.axis_size(axis_name)
  return math.log(epsilon) - 2.0 * sm_scale * q_norm * k_norm - math.log(seq_len)


def skipped_tile_fraction(q, k, log_fgate, *, block_q=128, block_k=64, sm_scale=None,
                          epsilon=DEFAULT_EPSILON):
  """Fraction of the causal (query block, key block) tiles that pruning skips, averaged over
  batch and heads. ``log_fgate`` must be finite here (no hard cuts)."""
  batch, seq_len, heads, head_dim = q.shape
  sm_scale = head_dim ** -0.5 if sm_scale is None else sm_scale
  delta = skip_threshold(q, k, sm_scale, epsilon)  # [B, H]
  c = jnp.cumsum(log_fgate.astype(jnp.float32), axis=1)  # [B, T, H]
  pad_to = lambda block: -(-seq_len // block) * block
  pad = lambda x, block, value: jnp.pad(x, [(0, 0), (0, pad_to(block) - seq_len), (0, 0)],
                                        constant_values=value)
  c_max_q = pad(c, block_q, -jnp.inf).reshape(batch, -1, block_q, heads).max(axis=2)  # [B, nq, H]
  c_min_k = pad(c, block_k, jnp.inf).reshape(batch, -1, block_k, heads).min(axis=2)  # [B, nk, H]
  gap = c_max_q[:, :, None, :] - c_min_k[:, None, :, :]  # [B, nq, nk, H]
  q_start = jnp.arange(c_max_q.shape[1]) * block_q
  k_start = jnp.arange(c_min_k.shape[1]) * block_k
  causal = (k_start[None, :] <= q_start[:, None] + block_q - 1)[None, :, :, None]
  skipped = causal & (gap < delta[:, None, None, :])
  return float(jnp.sum(skipped)) / (float(jnp.sum(causal)) * batch * heads)


def unless_skipped(threshold, c_rows, c_cols, compute, carry):
  """``compute(carry)``, or ``carry`` unchanged when the tile may be skipped.

  c_rows/c_cols: the tile's cumulative log gates, [..., rows] and [..., cols]; threshold: delta
  broadcastable to the leading dims, or None (never skip). A batched tile is skipped only when
  every (batch, head) in it may be.
  """
  if threshold is None:
    return compute(carry)
  # the high parts of a two-float c (decay.py) suffice for a bound: half an ulp of c moves the
  # skipped weight by a factor e^(ulp), not its order
  c_rows, c_cols = decay.coarse(c_rows), decay.coarse(c_cols)
  skip = jnp.max(c_rows, axis=-1) - jnp.min(c_cols, axis=-1) < threshold
  if skip.ndim:
    skip = jnp.all(skip)
  return lax.cond(skip, lambda unchanged: unchanged, compute, carry)

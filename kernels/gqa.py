"""Grouped-query attention (GQA): the one definition of which key/value head a query head reads.

q has HQ heads, k and v have H heads, HQ a multiple of H; the group size is G = HQ / H and
query head h reads key/value head ``h // G``: consecutive query heads share one key/value head
(the convention of fla's and tokamax's kernels, and what ``jnp.repeat(k, G, axis=heads)``
gives, which the tests use as the independent check). H = HQ is plain multi-head attention.

No backend repeats K or V in memory. Each reads the shared head: the reference and the
blockwise XLA backend multiply grouped operands ([..., H, G, ...] against [..., H, ...]); the
Pallas and Triton kernels index K/V with ``kv_head(program's query head, G)``. The forget gate
(log f, its cumsum c) and everything indexed by query position (segment ids, lse, delta, dc)
stay per QUERY head. The backward's dK/dV is a sum over the group's query heads; where each
backend forms it is said in its module docstring.
"""

import jax.numpy as jnp

from .block_sizes import floor_div


def group_size(q_heads, kv_heads):
  """G = HQ / H; a ValueError naming both counts when H does not divide HQ."""
  if kv_heads < 1 or q_heads % kv_heads:
    raise ValueError(f"forgetting_attention: q has {q_heads} heads and k, v {kv_heads}; grouped-query "
                     "attention needs the query heads to be a multiple of the key/value heads")
  return q_heads // kv_heads


def kv_head(q_head, group):
  """The key/value head that query head ``q_head`` reads (a traced program id in the kernels'
  index maps). ``lax.div`` (block_sizes.floor_div), not ``//``: jnp's floor division is a
  jitted function that Mosaic's index-map lowering refuses off a TPU; group 1 adds no op."""
  return q_head if group == 1 else floor_div(q_head, group)


def grouped(x, kv_heads, axis):
  """[..., HQ, ...] -> [..., H, G, ...] along ``axis`` (a view: query head h = (h // G, h % G))."""
  axis = axis % x.ndim
  return x.reshape(x.shape[:axis] + (kv_heads, x.shape[axis] // kv_heads) + x.shape[axis + 1:])


def ungrouped(x, axis):
  """Inverse of ``grouped``: [..., H, G, ...] at ``axis``, ``axis + 1`` -> [..., HQ, ...]."""
  axis = axis % x.ndim
  return x.reshape(x.shape[:axis] + (x.shape[axis] * x.shape[axis + 1],) + x.shape[axis + 2:])


def group_sum(x, group, axis, dtype=None):
  """Per-query-head gradients [..., HQ, ...] summed over each group -> [..., H, ...] (in
  ``dtype``, default x's). Group 1 returns x unchanged (cast)."""
  if group > 1:
    x = grouped(x, x.shape[axis] // group, axis).sum(axis=(axis % x.ndim) + 1)
  return x if dtype is None else x.astype(dtype)


def per_query_head(x, group, axis):
  """A per-key/value-head quantity ([..., H, ...], e.g. a key norm) for each query head."""
  return x if group == 1 else jnp.repeat(x, group, axis=axis)

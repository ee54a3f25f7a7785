"""Materialized forgetting attention: the O(T^2) ground truth every backend is tested against,
and ``tile_logits``, the one definition of the masked logits that every backend's tiles use
(the tests check the reference itself against a float64 numpy product form, which shares
nothing with it).

Inputs arrive already prepared by ``forgetting_attention`` (see ``api.py``): ``log_fgate`` is
finite (hard cuts were turned into segment boundaries) and ``segment_ids`` is an int32
[batch, seq, heads] array (one id sequence per head, because a cut in one head's gate cuts
only that head).
Gradients come from JAX autodiff, so this backend is also the reference for the backward pass.

Grouped-query attention (gqa.py): q's heads are viewed as [kv_heads, group] and multiplied
against the shared k, v head (no repeat); autodiff of that product sums dK/dV over the group.
"""

import jax
import jax.numpy as jnp

from . import decay
from .backends import Backend, register_backend
from .gqa import grouped, ungrouped


def tile_logits(qk, c_q, c_k, seg_q, seg_k, scale, q_start=0, k_start=0, causal=True,
                window=None, bias_scale=1.0):
  """Logits s_ij = scale * qk_ij + (c_i - c_j) * bias_scale of a tile of rows i and columns j, -inf where
  j > i, where i and j lie in different segments, or (with a ``window``) where i - j >= window.

  Every backend forms its logits here; only the dot product qk_ij = q_i.k_j (float32,
  [..., rows, cols]) is each backend's own, for its layout and precision. c_q, seg_q:
  [..., rows]; c_k, seg_k: [..., cols]; q_start, k_start: the positions of the first row and
  column. ``causal=False`` skips the causal compare, for a caller that knows every column of
  the tile precedes every row; ``window=None`` skips the band compare, for a caller that knows
  every column lies within the window of every row (or wants no window). c_q, c_k are
  ``decay.TwoFloat`` pairs (or plain float32 arrays), and c_i - c_j is formed from their parts
  (``decay.difference``: never a difference of two large float32 numbers). The Pallas kernel
  passes scale and ``bias_scale`` times log2(e) and gets base-2 logits; the decay is scaled only
  after the subtraction, where it is small.
  """
  row = lambda x: x[..., :, None]
  col = lambda x: x[..., None, :]
  bias = decay.difference(decay.tree_map(row, c_q), decay.tree_map(col, c_k))
  s = qk * scale + (bias if bias_scale == 1.0 else bias * bias_scale)
  mask = seg_q[..., :, None] == seg_k[..., None, :]
  if causal or window is not None:
    q_pos = q_start + jnp.arange(qk.shape[-2])
    k_pos = k_start + jnp.arange(qk.shape[-1])
    distance = q_pos[:, None] - k_pos[None, :]
    if causal:
      mask = mask & (distance >= 0)
    if window is not None:
      mask = mask & (distance < window)
  return jnp.where(mask, s, -jnp.inf)


def attention_logits(q, k, c, segment_ids, sm_scale, window=None):
  """Masked logits of the whole sequence as one tile, [batch, heads, seq, seq], float32.

  q [batch, seq, heads, D], k [batch, seq, kv_heads, D] (gqa.py); c (a ``decay.TwoFloat`` or a
  float32 array), segment_ids: [batch, seq, heads]; window: None or the band width (see
  ``tile_logits``).
  """
  qk = jnp.einsum("bqhgd,bkhd->bhgqk", grouped(q, k.shape[2], axis=2), k,
                  preferred_element_type=jnp.float32)
  qk = ungrouped(qk, axis=1)  # [batch, heads, seq, seq]
  to_heads = lambda x: jnp.swapaxes(x, 1, 2)  # [batch, heads, seq]
  c, seg = decay.tree_map(to_heads, c), to_heads(segment_ids)
  return tile_logits(qk, c, c, seg, seg, sm_scale, window=window)


def reference_attention(q, k, v, log_fgate, segment_ids, sm_scale, block_sizes=None, interpret=False,
                        window=None):
  """o_i = sum_j softmax_j(s_ij) v_j with the softmax in float32. Returns q.dtype.

  ``window``: None, or keys j with i - window < j <= i only (masked, not skipped: O(T^2) anyway).
  """
  del block_sizes, interpret  # the reference has no tiling
  c = decay.cumsum(log_fgate, axis=1)  # two float32 parts: see decay.py
  s = attention_logits(q, k, c, segment_ids, sm_scale, window)
  p = grouped(jax.nn.softmax(s, axis=-1), v.shape[2], axis=1)  # [batch, kv_heads, group, seq, seq]
  o = jnp.einsum("bhgqk,bkhd->bqhgd", p, v.astype(jnp.float32))
  return ungrouped(o, axis=2).astype(q.dtype)


# The ground truth: picked only by name, never by "auto"; it computes every tile, so pruning
# (an approximation) has nothing to skip.
register_backend(Backend("reference", reference_attention, pruning=False))

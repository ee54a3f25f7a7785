"""Materialized forgetting attention: the O(T^2) ground truth every backend is tested against.

Inputs arrive already prepared by ``forgetting_attention`` (see ``api.py``): ``log_fgate`` is
finite (hard cuts were turned into segment boundaries) and ``segment_ids`` is an int32
[batch, seq, heads] array (one id sequence per head, because a cut in one head's gate cuts
only that head).
Gradients come from JAX autodiff, so this backend is also the reference for the backward pass.
"""

import jax
import jax.numpy as jnp


def attention_logits(q, k, c, segment_ids, sm_scale):
  """Masked logits s_ij = scale * q_i.k_j + c_i - c_j, shape [batch, heads, seq, seq], float32.

  c, segment_ids: [batch, seq, heads].

  Masked entries (j > i, or another segment) are -inf.
  """
  seq_len = q.shape[1]
  s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) * sm_scale
  c = jnp.swapaxes(c, 1, 2)  # [batch, heads, seq]
  s = s + c[:, :, :, None] - c[:, :, None, :]
  causal = jnp.tril(jnp.ones((seq_len, seq_len), dtype=bool))
  seg = jnp.swapaxes(segment_ids, 1, 2)  # [batch, heads, seq]
  mask = causal & (seg[:, :, :, None] == seg[:, :, None, :])
  return jnp.where(mask, s, -jnp.inf)


def reference_attention(q, k, v, log_fgate, segment_ids, sm_scale, block_sizes=None, interpret=False):
  """o_i = sum_j softmax_j(s_ij) v_j with the softmax in float32. Returns q.dtype."""
  del block_sizes, interpret  # the reference has no tiling
  c = jnp.cumsum(log_fgate.astype(jnp.float32), axis=1)
  s = attention_logits(q, k, c, segment_ids, sm_scale)
  p = jax.nn.softmax(s, axis=-1)
  o = jnp.einsum("bhqk,bkhd->bqhd", p, v.astype(jnp.float32))
  return o.astype(q.dtype)

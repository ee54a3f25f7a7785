"""Rotary position embedding (RoPE) with a configurable base theta."""

import jax.numpy as jnp

from lpcjax.kernels import segment_starts
from lpcjax.sharding import cummax_along_sequence


def segment_positions(segment_ids, seq_len):
  """Position of each token inside its segment ([batch, seq]); arange when segment_ids is None."""
  positions = jnp.arange(seq_len, dtype=jnp.int32)[None, :]
  if segment_ids is None:
    return positions
  starts = jnp.where(segment_starts(segment_ids), positions, 0)
  start_pos = cummax_along_sequence(starts, ("activation_batch", "activation_length"))
  return positions - start_pos


def apply_rope(x, positions, theta=10000.0):
  """Rotate pairs (x[..., :D/2], x[..., D/2:]) of x [batch, seq, heads, D] by positions * freq.

  Computed in float32, returned in x.dtype. The half-split pairing (not interleaved) is the
  LLaMA/HF convention; any fixed pairing gives the same relative-position property.
  """
  half = x.shape[-1] // 2
  freq = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angle = positions[..., None].astype(jnp.float32) * freq  # [batch, seq, half]
  sin, cos = jnp.sin(angle)[:, :, None, :], jnp.cos(angle)[:, :, None, :]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)

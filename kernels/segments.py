"""Segment starts of packed sequences, shared by the kernel's input preparation and the layers
that must not carry state across documents (RoPE positions, KV-shift)."""

import jax.numpy as jnp


def segment_starts(segment_ids):
  """[batch, seq] bool: True where a token's segment id differs from the previous token's.

  Position 0 is False: nothing precedes it, so there is nothing to cut off.
  """
  return jnp.pad(segment_ids[:, 1:] != segment_ids[:, :-1], [(0, 0), (1, 0)])

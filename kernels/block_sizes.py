"""Tile sizes shared by the blockwise backends, the padding that makes T fit them, and the
tile ranges that a sliding window leaves to compute."""

import dataclasses
from typing import Optional

import jax.numpy as jnp
from jax import lax


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Tile sizes (powers of two >= 8). ``block_q``/``block_k`` tile the forward pass; the
  backward kernels use their own sizes where given (``*_dkv`` for the key-block sweep, ``*_dq``
  for the query-block sweep) and the forward ones otherwise. Sizes larger than the (padded)
  sequence shrink to fit it."""

  block_q: int = 128
  block_k: int = 128
  block_q_dkv: Optional[int] = None
  block_k_dkv: Optional[int] = None
  block_q_dq: Optional[int] = None
  block_k_dq: Optional[int] = None

  def __post_init__(self):
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if value is None and field.name not in ("block_q", "block_k"):
        continue
      if not isinstance(value, int) or value < 8 or value & (value - 1):
        raise ValueError(f"BlockSizes.{field.name} must be a power of two >= 8, got {value!r}")

  def fitted(self, seq_len, minimum=8):
    """A copy whose sizes are at most the next power of two >= seq_len (and >= minimum), with
    the backward sizes filled in."""
    cap = max(minimum, 1 << max(seq_len - 1, 0).bit_length())
    fit = lambda size: max(minimum, min(size, cap))
    q, k = fit(self.block_q), fit(self.block_k)
    return BlockSizes(q, k, fit(self.block_q_dkv or q), fit(self.block_k_dkv or k),
                      fit(self.block_q_dq or q), fit(self.block_k_dq or k))

  @property
  def largest(self):
    return max(self.block_q, self.block_k, self.block_q_dkv or 0, self.block_k_dkv or 0,
               self.block_q_dq or 0, self.block_k_dq or 0)


def require_head_dim(impl, head_dim, supported):
  """The one-line error of a backend that cannot take ``head_dim``."""
  if head_dim not in supported:
    raise ValueError(f"forgetting_attention: impl={impl!r} supports head_dim in {tuple(supported)}, "
                     f"got {head_dim}")


def padded_length(seq_len, multiple):
  """seq_len rounded up to a multiple of ``multiple`` (the largest tile)."""
  return -(-seq_len // multiple) * multiple


def pad_seq(x, padded_len, axis=1, fill=0):
  """Pad axis ``axis`` of x up to padded_len with ``fill``, or with copies of the last entry
  when fill is "edge"."""
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, padded_len - x.shape[axis])
  if isinstance(fill, str):
    return jnp.pad(x, pad, mode=fill)
  return jnp.pad(x, pad, constant_values=fill)


def heads_major(x, padded_len, fill=0):
  """[batch, seq, heads, ...] -> [batch, heads, padded_len, ...], padded along seq (zeros by
  default; ``fill`` as in ``pad_seq``): the layout in which each (batch, head) holds one contiguous sequence to tile."""
  return jnp.swapaxes(pad_seq(x, padded_len, fill=fill), 1, 2)


# Block ranges of a sliding window (keys j with i - window < j <= i). Starts may be traced int32
# (a loop index times the block size); lax.div on non-negative operands is the floor division
# that both XLA and the Triton lowering accept.

def floor_div(a, b):
  """a // b for non-negative integers, a traced (int32 in a kernel, where program ids are int32)
  and b a Python int or an array. lax.div does not promote: under ``jax_enable_x64`` a Python
  int becomes int64 and lax.div(int32, int64) fails at trace time, so b takes a's dtype."""
  a = jnp.asarray(a)
  return lax.div(a, jnp.asarray(b, a.dtype))


def first_key_block_in_window(q_start, block_k, window):
  """The first key block that reaches into the window of the query block starting at q_start:
  the blocks left of it hold only keys at least ``window`` before every query, and are skipped."""
  if window is None:
    return 0
  return floor_div(jnp.maximum(q_start - window + 1, 0), block_k)


def query_block_end_in_window(k_start, block_k, block_q, num_q_blocks, window):
  """One past the last query block whose window reaches the key block starting at k_start (its
  last key, k_start + block_k - 1, is seen up to query k_start + block_k + window - 2)."""
  if window is None:
    return num_q_blocks
  return jnp.minimum(floor_div(k_start + block_k + window - 2, block_q) + 1, num_q_blocks)

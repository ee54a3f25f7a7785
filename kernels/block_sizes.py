"""Tile sizes shared by the blockwise backends, the padding that makes T fit them, and the
tile ranges that a sliding window leaves to compute."""

import dataclasses
from typing import Optional

import jax.numpy as jnp
import numpy as np
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


def tiles_for(table, head_dim, dtype):
  """A backend's tile table's entry, keyed by (float32 inputs, head dim > 64): GPU kernels need
  other tiles for float32 (no tensor cores) and for the larger head dim (registers)."""
  return table[jnp.dtype(dtype) == jnp.float32, head_dim > 64]


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
# that both XLA and the Triton lowering accept. Numpy starts give numpy bounds, computed on the
# host with no device: the TPU wrapper's static visit ranges, whose eager evaluation would
# otherwise run on the default device, which an ahead-of-time compile makes a chip that is absent.

def _numpy_or_jnp(x):
  return np if isinstance(x, (int, np.integer, np.ndarray)) else jnp


def floor_div(a, b):
  """a // b for non-negative integers, a traced (int32 in a kernel, where program ids are int32)
  or numpy, and b a Python int or an array. lax.div does not promote: under ``jax_enable_x64``
  a Python int becomes int64 and lax.div(int32, int64) fails at trace time, so b takes a's dtype."""
  if _numpy_or_jnp(a) is np:
    return np.asarray(a) // b
  a = jnp.asarray(a)
  return lax.div(a, jnp.asarray(b, a.dtype))


def first_key_block_in_window(q_start, block_k, window):
  """The first key block that reaches into the window of the query block starting at q_start:
  the blocks left of it hold only keys at least ``window`` before every query, and are skipped."""
  if window is None:
    return 0
  return floor_div(_numpy_or_jnp(q_start).maximum(q_start - window + 1, 0), block_k)


def query_block_end_in_window(k_start, block_k, block_q, num_q_blocks, window):
  """One past the last query block whose window reaches the key block starting at k_start (its
  last key, k_start + block_k - 1, is seen up to query k_start + block_k + window - 2); 0 when
  that query lies before the first (k_start relative to the queries' start may be negative)."""
  if window is None:
    return num_q_blocks
  xp = _numpy_or_jnp(k_start)
  last_row = k_start + block_k + window - 2
  return xp.where(last_row < 0, 0, xp.minimum(floor_div(xp.maximum(last_row, 0), block_q) + 1, num_q_blocks))


# Block ranges of a pair (query block, key side) or (key block, query side) that may be two
# different stretches of one sequence (the context-parallel ring's chunks): ``rel`` is the
# global position of the program's first element minus that of the other side's first, any
# int (negative: the other side lies after it). Single-device attention is rel = the block's
# own start. Traced int32 throughout; floor_div only ever sees non-negative operands.

def _ceil_div(a, b):
  return floor_div(jnp.maximum(a, 0) + b - 1, b)


def key_block_ranges(rel, block_q, block_k, num_k_blocks, window):
  """(first, inside, crossing, end) of the key blocks a query block visits: [first, inside)
  are crossed by the window's edge (band mask), [inside, crossing) lie wholly inside the band
  left of the causal diagonal (no position compare), [crossing, end) cross the diagonal
  (masked); all clipped to the key side's ``num_k_blocks``. Without a window first = inside = 0."""
  clip = lambda x: jnp.minimum(x, num_k_blocks)
  crossing = clip(floor_div(jnp.maximum(rel, 0), block_k))
  end = clip(_ceil_div(rel + block_q, block_k))
  if window is None:
    zero = jnp.zeros_like(crossing)
    return zero, zero, crossing, end
  first = clip(first_key_block_in_window(rel, block_k, window))
  inside = jnp.minimum(_ceil_div(rel + block_q - window, block_k), crossing)
  return first, inside, crossing, end


def query_block_ranges(rel, block_q, block_k, num_q_blocks, window):
  """(first, below, partial, end) of the query blocks a key block visits: [first, below) cross
  the causal diagonal (masked), [below, partial) lie wholly below it inside the band (no
  position compare), [partial, end) are crossed by the window's edge (band mask); the band
  ends the sweep after the last query block it reaches. Without a window partial = end."""
  clip = lambda x: jnp.minimum(x, num_q_blocks)
  first = clip(floor_div(jnp.maximum(rel, 0), block_q))
  below = clip(_ceil_div(rel + block_k, block_q))
  end = query_block_end_in_window(rel, block_k, block_q, num_q_blocks, window)
  if window is None:
    end = jnp.full_like(first, num_q_blocks)
    return first, below, end, end
  partial = jnp.maximum(jnp.minimum(floor_div(jnp.maximum(rel + window, 0), block_q), end), below)
  return first, below, partial, end

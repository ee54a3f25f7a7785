"""How the GPU kernels (Pallas-Triton, pallas_gpu.py; Triton through jax-triton,
triton_backend.py) are called: on one device, through the custom_vjp of vjp.py, and as the
context-parallel ring's pair kernels (``backends.PairKernels``), from one set of kernels.

Every kernel takes a block pair: the rows' and the columns' c (decay.py's two float32 parts),
segment ids and the global positions of their first elements come separately (``Operands``),
and the causal and window loop bounds follow the global positions (block_sizes.py's
``key_block_ranges`` / ``query_block_ranges``), so a pair that the band rules out costs no
tile. Single-device attention is the special case of the sequence paired with itself: the
same arrays on both sides, offsets (0, 0), the caller's [B, T, H, D] layout, outputs in the
input dtype with dq, dk already times sm_scale. A pair of the ring (``Static.pair``) runs on
heads-major chunks [B, H, T, D] and returns float32 (the ring sums the pairs of every step),
dq and dk not yet scaled, and lse in natural units, by which the ring merges partial outputs.
The kernels keep base-2 logits (exp2 is the fast instruction), so ``pair_kernels`` converts
lse on the way in and out; a row that saw no key of any chunk (a padded row) has lse = -inf,
which goes back in as +inf, so that the backward's exp2(s - lse) is 0 there rather than NaN.
"""

import dataclasses
import math
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from . import decay, row_term
from .backends import PairKernels
from .block_sizes import BlockSizes, heads_major, pad_seq, padded_length, require_head_dim
from .gqa import group_sum
from .vjp import BackendKernels, differentiable

LOG2_E = math.log2(math.e)


class Operands(NamedTuple):
  """The position-indexed inputs of a pair besides q, k, v: c of the rows and of the columns
  (decay.TwoFloat, [B, HQ, Tq] and [B, HQ, Tk]), their segment ids (int32, same shapes), the
  pruning threshold [B, HQ] float32 (read only with ``Static.prune``) and ``offsets``, int32
  [2]: the global positions of the first row and of the first column."""

  c_q: decay.TwoFloat
  c_k: decay.TwoFloat
  seg_q: jax.Array
  seg_k: jax.Array
  thr: jax.Array
  offsets: jax.Array

  @classmethod
  def self_attention(cls, c, seg, thr):
    """The sequence paired with itself."""
    return cls(c, c, seg, seg, thr, jnp.zeros((2,), jnp.int32))


@dataclasses.dataclass(frozen=True)
class Static:
  """A GPU backend's compile-time options. ``pair``: the ring's contract (heads-major chunks,
  float32 outputs, dq and dk unscaled) instead of single-device attention's; ``interpret``:
  Pallas interpret mode (the Triton glue has its own launcher hook instead)."""

  sm_scale: float
  sizes: BlockSizes
  prune: bool
  window: Optional[int]
  interpret: bool = False
  pair: bool = False


class Shapes(NamedTuple):
  """The sizes of a call in either layout: q [B, Tq, HQ, D] and k [B, Tk, H, D] on one device,
  [B, HQ, Tq, D] and [B, H, Tk, D] for a pair (``heads_major``)."""

  batch: int
  heads: int
  group: int
  q_len: int
  k_len: int
  head_dim: int
  heads_major: bool

  @classmethod
  def of(cls, q, k, static):
    if static.pair:
      (batch, heads, q_len, head_dim), kv_heads, k_len = q.shape, k.shape[1], k.shape[2]
    else:
      (batch, q_len, heads, head_dim), kv_heads, k_len = q.shape, k.shape[2], k.shape[1]
    return cls(batch, heads, heads // kv_heads, q_len, k_len, head_dim, static.pair)

  def vector(self, length):
    """A [B, HQ, length] float32 output (lse, delta, dc)."""
    return jax.ShapeDtypeStruct((self.batch, self.heads, length), jnp.float32)

  def like(self, shape_of, dtype):
    """An output of q's or k's shape (``shape_of``): float32 for a pair, else ``dtype``."""
    return jax.ShapeDtypeStruct(shape_of.shape, jnp.float32 if self.heads_major else dtype)

  def key_shares(self, k):
    """The dK/dV kernel's output: one share per query head, [B, Tk, HQ, D] ([B, HQ, Tk, D]),
    float32 where a group or the ring sums them."""
    shape = ((self.batch, self.heads, self.k_len, self.head_dim) if self.heads_major
             else (self.batch, self.k_len, self.heads, self.head_dim))
    return jax.ShapeDtypeStruct(shape, jnp.float32 if self.group > 1 or self.heads_major else k.dtype)

  def summed(self, share, k):
    """The group's shares summed into k's heads, in k's dtype (float32 for a pair)."""
    return group_sum(share, self.group, 1 if self.heads_major else 2,
                     jnp.float32 if self.heads_major else k.dtype)


def grad_scale(static):
  """What the kernels multiply dq and dk by: sm_scale, or 1 for a pair (the ring scales once,
  after summing the pairs)."""
  return 1.0 if static.pair else static.sm_scale


class GpuKernels(NamedTuple):
  """A GPU backend's kernels over ``Operands`` (o, lse2 and dq in q's layout, dk/dv in k's, the
  per-position vectors [B, HQ, T]; lse2 is base 2):

  * ``forward(q, k, v, ops, static)`` -> (o, lse2);
  * ``row_term(q, k, v, ops, do, lse2, static)`` -> delta (recomputed from the tiles);
  * ``backward_dq(q, k, v, ops, do, lse2, delta, static)`` -> dq, or for a backend with
    ``forward_two_part`` (dq, dc_rows): dc_rows_i = sum_j dS_ij, the rows' half of dc, which the
    others leave out because it is zero up to delta's error;
  * ``backward_dkv(q, k, v, ops, do, lse2, delta, static)`` -> (dk, dv summed over each
    group's query heads, dc);
  * optionally ``forward_two_part(q, k, v, ops, static)`` -> (o, o_lo, lse2), the forward run
    for a gradient on one device, whose o + o_lo gives the backward its delta instead of
    ``row_term`` (vjp.py's ``BackendKernels.forward_two_part``; row_term.py says why its
    backward_dq adds the rows' sums);
  * optionally ``backward(q, k, v, ops, do, lse2, delta, static)`` -> (dq, dk, dv, dc), dc with
    both halves: the whole backward in one call on one device, instead of backward_dq and
    backward_dkv (Mosaic GPU's ``Version.fused_backward``).
  """

  forward: Callable
  row_term: Callable
  backward_dq: Callable
  backward_dkv: Callable
  forward_two_part: Optional[Callable] = None
  backward: Optional[Callable] = None


def decay_cumsum(log_fgate):
  """c of [B, H, T] log f: decay.py's two float32 parts, natural units (the tiles scale their
  c_i - c_j by log2 e)."""
  return decay.cumsum(log_fgate, axis=-1)


def row_term_from_output(o, do):
  """delta [B, H, T] from o, dO [B, T, H, D] (the single-device layout of the GPU kernels)."""
  return jnp.swapaxes(row_term.from_output(o, do), 1, 2)


def single_device(kernels, impl, head_dims, fit_block_sizes, check):
  """A backend's ``Backend`` function: ``attention(q, k, v, log_fgate, segment_ids, sm_scale,
  block_sizes=None, interpret=False, prune_threshold=None, window=None) -> o`` in
  ``forgetting_attention``'s layouts (q [B, T, HQ, D], k, v [B, T, H, D], log f and ids
  [B, HQ, T]), running ``kernels`` (a ``GpuKernels``) through the custom_vjp of vjp.py. T is
  padded up to the tiles and the output cropped back. ``prune_threshold`` [B, HQ] (or None)
  enables tile skipping (pruning.py); ``window``: None or a static int, sliding-window attention
  (tiles outside the band skipped). ``impl``, ``head_dims``: the backend's name and head dims;
  ``fit_block_sizes`` and ``check`` as ``pair_kernels``' ``block_sizes`` and ``check``."""

  def forward(q, k, v, c, seg, thr, static):
    return kernels.forward(q, k, v, Operands.self_attention(c, seg, thr), static)

  def forward_two_part(q, k, v, c, seg, thr, static):
    return kernels.forward_two_part(q, k, v, Operands.self_attention(c, seg, thr), static)

  def row_term(q, k, v, c, seg, thr, do, lse2, static):
    return kernels.row_term(q, k, v, Operands.self_attention(c, seg, thr), do, lse2, static)

  def backward(q, k, v, c, seg, thr, do, lse2, delta, static):
    args = (q, k, v, Operands.self_attention(c, seg, thr), do, lse2, delta, static)
    if kernels.backward is not None:
      return kernels.backward(*args)
    dk, dv, dc = kernels.backward_dkv(*args)
    if kernels.forward_two_part is None:
      return kernels.backward_dq(*args), dk, dv, dc
    dq, dc_rows = kernels.backward_dq(*args)  # dc_t = sum_j dS_tj - sum_i dS_it, both halves
    return dq, dk, dv, dc + dc_rows

  padded = differentiable(BackendKernels(
      cumsum=decay_cumsum, forward=forward, row_term=row_term,
      row_term_from_output=row_term_from_output, backward=backward, seq_axis=2,
      forward_two_part=forward_two_part if kernels.forward_two_part else None))

  def attention(q, k, v, log_fgate, segment_ids, sm_scale, block_sizes=None, interpret=False,
                prune_threshold=None, window=None):
    seq_len, head_dim = q.shape[1], q.shape[-1]
    require_head_dim(impl, head_dim, head_dims)
    check(interpret)
    sizes = fit_block_sizes(block_sizes, seq_len, head_dim, q.dtype)
    padded_len = padded_length(seq_len, sizes.largest)
    prune = prune_threshold is not None
    # The threshold stays in natural units, as c does.
    thr = prune_threshold if prune else jnp.zeros(q.shape[:1] + q.shape[2:3])
    o = padded(pad_seq(q, padded_len), pad_seq(k, padded_len), pad_seq(v, padded_len),
               heads_major(log_fgate, padded_len).astype(jnp.float32),
               heads_major(segment_ids, padded_len).astype(jnp.int32), thr.astype(jnp.float32),
               (Static(float(sm_scale), sizes, prune, window, bool(interpret)),))
    return o[:, :seq_len]

  attention.__name__ = attention.__qualname__ = f"{impl}_attention"
  return attention


def _base2(lse):
  """A natural-log lse as the kernels' base-2 one; -inf (no key seen) as +inf: p = 0."""
  return jnp.where(jnp.isneginf(lse), jnp.inf, lse * LOG2_E)


def pair_kernels(kernels, block_sizes, check):
  """``backends.PairKernels`` running ``kernels`` (a ``GpuKernels``) on the ring's chunks.
  ``block_sizes(block_sizes, chunk_len, head_dim, dtype)``: the backend's fitted tiles for inputs
  of ``dtype``;
  ``check(interpret)``: raises if the kernels cannot run here (at trace time)."""
  if kernels.forward_two_part is not None:  # its backward_dq returns dS's row sums too, which the ring does not take
    raise ValueError("pair_kernels: a backend with forward_two_part has no context-parallel path yet")

  def prepared(c_q, c_k, seg_q, seg_k, thr, offsets, sm_scale, sizes, window, interpret):
    check(interpret)
    heads = c_k.hi.shape[:2] if isinstance(c_k, decay.TwoFloat) else c_k.shape[:2]
    ops = Operands(decay.as_two_float(c_q), decay.as_two_float(c_k), seg_q.astype(jnp.int32),
                   seg_k.astype(jnp.int32), jnp.zeros(heads, jnp.float32) if thr is None else thr,
                   jnp.stack([jnp.asarray(x, jnp.int32) for x in offsets]))
    return ops, Static(float(sm_scale), sizes, thr is not None, window, bool(interpret), pair=True)

  def forward(q, k, v, c_q, c_k, seg_q, seg_k, thr, offsets, *options):
    o, lse2 = kernels.forward(q, k, v, *prepared(c_q, c_k, seg_q, seg_k, thr, offsets, *options))
    return o, lse2 / LOG2_E  # -inf stays -inf

  def row_term(q, k, v, c_q, c_k, seg_q, seg_k, thr, offsets, do, lse, *options):
    ops, static = prepared(c_q, c_k, seg_q, seg_k, thr, offsets, *options)
    return kernels.row_term(q, k, v, ops, do, _base2(lse), static)

  def backward(kernel):
    def run(q, k, v, c_q, c_k, seg_q, seg_k, thr, offsets, do, lse, delta, *options):
      ops, static = prepared(c_q, c_k, seg_q, seg_k, thr, offsets, *options)
      return kernel(q, k, v, ops, do, _base2(lse), delta, static)
    return run

  return PairKernels(forward, row_term, backward(kernels.backward_dq), backward(kernels.backward_dkv),
                     block_sizes)

"""Forgetting attention as Pallas kernels for TPUs (Mosaic), same algorithm as ``pallas_gpu``.

Four kernels, none with a [T, T] array in HBM: the forward (o, log-normalizer); with bf16/fp16
inputs the row term delta_i = sum_j P_ij dP_ij (row_term.py says why); dK/dV/dc, where
dc_j = -sum_i dS_ij is a column sum accumulated per key block; dQ. d log_fgate is then the
reverse cumsum of dc, outside the kernels.

TPU layout. Each kernel's grid is (batch, head, step): an outer block (a query block, or a
key block for dK/dV) stays in VMEM while consecutive steps of the last, "arbitrary" grid axis
stream the blocks of the other side through it, accumulating in VMEM scratch. The blocks an
outer block visits form one contiguous range [lo, hi): the causal diagonal bounds it, a
sliding window bounds the other end, and pruning (pruning.py) moves an end inwards. The steps
are a schedule of the (outer, streamed) pairs within the causal and window bounds only, so no
step is spent above the diagonal; it and the ranges ``lo``, ``hi`` (per outer block, or per
(batch, head, outer block) once pruning moved them), computed in the wrapper, reach the
kernels by scalar prefetch (SMEM). The index maps
clamp the streamed block into the pruned range: pruned tiles are never copied from HBM,
their steps do nothing. Tiles that cross the diagonal or the window's edge are masked, the
others compare segment ids only.

Vectors indexed by position (c = cumsum log f as decay.py's two float32 parts, segment ids,
lse, delta, dc) travel as compact rows [B, H, 1, T] (4 bytes a position in HBM; a reshape of
[B, H, T], nothing broadcast), in [1, block] blocks. Mosaic tiles the last two dims of a block
by (8 sublanes, 128 lanes), and a tile needs the query side's vectors along one axis and the
key side's along the other: the streamed side's rows broadcast against the tile as they are,
the outer side's become a [block, 1] column inside the kernel (``expand_dims`` of the row, a
relayout JAX's splash attention makes of its lse and di), and outputs accumulated as
[block, 128] columns in VMEM scratch leave as rows through one 2-D transpose per outer block.
That is why the dK/dV kernel computes the transposed tile S^T [key, query]: its streamed side
is the queries, whose five vectors then stay rows. It also fixes the block sizes: every block
is the lane dimension of its vectors' rows, so a multiple of 128. (Until Dec 2026 the outer
side's vectors came as lane-broadcast columns [B, H, T, 128] built in the wrapper: 512 bytes
a position each, about 2.6 KiB per (position, head) for the dQ call alone;
benchmarks/tpu_backward_memory.py.)

q, k, v move to [B, H, T, D] so that a block's last two dims are (sequence, head_dim). Logits
use natural exp (the EUP's), unlike the GPU kernel's exp2. On CPU the kernels run in Pallas'
TPU interpret mode (``interpret=True`` maps to ``pltpu.InterpretParams()``), which simulates
VMEM, SMEM, scalar prefetch and the DMAs of the pipeline.

Grouped-query attention (gqa.py): the grid's head axis runs over query heads and the block
specs of k and v read key/value head ``h // G`` (no repeat of K/V in memory). dK/dV keeps one
outer key block per (batch, query head) and writes that query head's share in float32; the
wrapper sums each group's G shares (``gqa.group_sum``): during the backward, G float32 copies
of K and of V. G = 1 keeps the previous kernels and outputs exactly.

Why one module of ~540 lines: the four kernels share the schedule, the visit ranges and the
row/column layouts above; split apart, each half would need the other's private layout rules.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from . import decay, row_term
from .backends import Backend, register_backend
from .vjp import BackendKernels, differentiable
from .gqa import group_sum, kv_head
from .block_sizes import (BlockSizes, first_key_block_in_window, heads_major, padded_length,
                          query_block_end_in_window, require_head_dim)

# Powers of two that the (8, 128) tiling takes as a full last block dim. 64 and smaller pad to
# 128 lanes inside the tiles (the MXU sees 128); lowering for TPU was checked on CPU for each.
SUPPORTED_HEAD_DIMS = (16, 32, 64, 128, 256)
LANES, SUBLANES = 128, 8
# VMEM that the default tiles may fill: 3/4 of the default scoped limit of v5e (16 MiB; v6e
# has 32), leaving room for what the estimate below leaves out.
VMEM_BUDGET_BYTES = 12 * 2**20
_PARALLEL, _ARBITRARY = "parallel", "arbitrary"


def on_tpu():
  """Whether un-interpreted kernels can run here (tests patch this to lower for TPU on CPU)."""
  return jax.default_backend() == "tpu"


def vmem_bytes(outer, inner, head_dim, dtype):
  """Estimated VMEM of the hungriest kernel at square-ish tiles: outer and streamed blocks
  double-buffered (at most 4 [outer, D] blocks: dK/dV's k, v, dk, dv; 2 streamed [inner, D];
  5 outer and 5 streamed [1, block] vector rows, padded to 8 sublanes: c's two parts, ids, lse,
  delta), float32 scratch (2 [outer, D] and a column) and 4 float32 [outer, inner] tile
  temporaries (s, p, dp, ds)."""
  item = jnp.dtype(dtype).itemsize
  blocks = (4 * outer + 2 * inner) * head_dim * item + 5 * SUBLANES * (outer + inner) * 4
  scratch = (2 * outer * head_dim + outer * LANES) * 4
  return 2 * blocks + scratch + 4 * outer * inner * 4


def default_block_sizes(head_dim, dtype):
  """Untuned (no TPU was available to measure): the largest square tiles, 512 down to 128,
  whose estimated VMEM fits VMEM_BUDGET_BYTES."""
  for size in (512, 256):
    if vmem_bytes(size, size, head_dim, dtype) <= VMEM_BUDGET_BYTES:
      return BlockSizes(size, size)
  return BlockSizes(128, 128)


def tpu_block_sizes(block_sizes, seq_len, dtype, head_dim):
  """``block_sizes`` (or the default) fitted to T and to the TPU tiling: every block, outer
  or streamed, is the lane dimension of its vectors' [1, block] rows, so at least 128. Like
  the GPU kernel's minimum of 16, smaller requests are raised, not refused; every size stays a
  power of two, so the padded length (a multiple of the largest) is a multiple of every size."""
  return (block_sizes or default_block_sizes(head_dim, dtype)).fitted(seq_len, minimum=LANES)


# ------------------------------------------------------------------------------ visit ranges

def _block_gaps(c, block_rows, block_cols):
  """max_I c - min_J c per (query block I, key block J): [B, H, nq, nk], for c [B, H, T] (the
  high part of a two-float c: a bound needs no more)."""
  c = decay.coarse(c)
  batch, heads, seq_len = c.shape
  c_max = c.reshape(batch, heads, seq_len // block_rows, block_rows).max(axis=-1)
  c_min = c.reshape(batch, heads, seq_len // block_cols, block_cols).min(axis=-1)
  return c_max[..., :, None] - c_min[..., None, :]


def _static(value, like):
  """A block_sizes.py bound (evaluated at trace time: its inputs are numpy constants) as an
  int numpy array shaped like ``like``."""
  return np.asarray(value, np.int64) * np.ones_like(like)


def _leading_run(flags):
  """Length of the run of Trues at the start of the last axis."""
  return jnp.sum(jnp.cumprod(flags.astype(jnp.int32), axis=-1), axis=-1)


def key_ranges(c, threshold, bq, bk, window):
  """Key blocks [lo, hi) that each query block visits (forward, row term, dQ): int32
  [B, H, nq] each, and the same before pruning, numpy [nq] each (the grid's schedule).

  hi is one past the block holding the query block's last row (causal); lo is the first block
  the window reaches, then moved right past the leading tiles that pruning may skip (the rule
  of ``pruning.unless_skipped``: max c of the rows - min c of the columns < threshold). c is
  non-increasing, so those tiles are leading; only a run of them is skipped, so a tile that
  fails the rule is computed whatever c holds. The diagonal tile never passes it.
  """
  batch, heads, seq_len = decay.coarse(c).shape
  q_start = np.arange(seq_len // bq) * bq
  hi = (q_start + bq + bk - 1) // bk
  with jax.ensure_compile_time_eval():
    lo = _static(first_key_block_in_window(q_start, bk, window), hi)
  shape = (batch, heads, len(q_start))
  if threshold is None:
    lo_blocks = jnp.broadcast_to(jnp.asarray(lo, jnp.int32), shape)
  else:
    before = np.arange(seq_len // bk)[None, :] < lo[:, None]  # [nq, nk]: left of the window
    skip = _block_gaps(c, bq, bk) < threshold[:, :, None, None]
    lo_blocks = _leading_run(before | skip).astype(jnp.int32)
  return lo_blocks, jnp.broadcast_to(jnp.asarray(hi, jnp.int32), shape), lo, hi


def query_ranges(c, threshold, bq, bk, window):
  """Query blocks [lo, hi) that each key block visits (dK/dV/dc): int32 [B, H, nk] each, and
  the same before pruning, numpy [nk] each. lo holds the key block's first column (causal);
  hi ends at the last query block the window reaches, then moves left past the trailing
  tiles pruning may skip."""
  batch, heads, seq_len = decay.coarse(c).shape
  num_q_blocks = seq_len // bq
  k_start = np.arange(seq_len // bk) * bk
  lo = k_start // bq
  with jax.ensure_compile_time_eval():
    hi = _static(query_block_end_in_window(k_start, bk, bq, num_q_blocks, window), lo)
  shape = (batch, heads, len(k_start))
  if threshold is None:
    hi_blocks = jnp.broadcast_to(jnp.asarray(hi, jnp.int32), shape)
  else:
    after = np.arange(num_q_blocks)[None, :] >= hi[:, None]  # [nk, nq]: below the window
    skip = jnp.swapaxes(_block_gaps(c, bq, bk), -1, -2) < threshold[:, :, None, None]
    hi_blocks = (num_q_blocks - _leading_run((after | skip)[..., ::-1])).astype(jnp.int32)
  return jnp.broadcast_to(jnp.asarray(lo, jnp.int32), shape), hi_blocks, lo, hi


# ---------------------------------------------------------------------------- kernel pieces

def _matmul(a, b, contract):
  """a . b over dims ``contract`` = (a's, b's), accumulated in float32; float32 inputs in full
  float32 precision (the MXU's default would round them to bf16)."""
  return lax.dot_general(a, b, ((contract[:1], contract[1:]), ((), ())),
                         precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)


NN, NT = (1, 0), (1, 1)  # a @ b, a @ b.T


def tile_logits_2d(qk, c_q, c_k, seg_q, seg_k, q_pos, k_pos, scale, causal, window):
  """``reference.tile_logits`` in Mosaic's 2-D form: scale * qk + (c_i - c_j), -inf across
  segments, where j > i (``causal``) and where i - j >= ``window`` (not None).

  Every operand is already 2-D and broadcasts against the tile qk: the query-side ones
  (c_q, seg_q, q_pos) along the tile's query axis, as a column [rows, 1] in the forward and dQ
  kernels and as a row [1, cols] in the transposed dK/dV tile, and the key-side ones along the
  other axis (Mosaic has neither 1-D iotas nor cheap row/column relayouts). The tests check it
  against the reference's ``tile_logits`` in both orientations. c_q, c_k: two-float
  (decay.TwoFloat of such operands) or plain float32; the decay comes from their parts.
  """
  s = qk * scale + decay.difference(c_q, c_k)
  mask = seg_q == seg_k
  distance = q_pos - k_pos
  if causal:
    mask = mask & (distance >= 0)
  if window is not None:
    mask = mask & (distance < window)
  return jnp.where(mask, s, -jnp.inf)


def _positions(start, shape, axis):
  return start + lax.broadcasted_iota(jnp.int32, shape, axis)


# The schedule packs each grid step's (outer block, streamed block, first, last) in one int32
# (SMEM is small): outer << 16 | inner << 2 | last << 1 | first.
_INDEX_BITS = 14


def schedule(lo, hi):
  """The grid steps of one sweep, int32 numpy [steps]: for each outer block o in turn, the
  streamed blocks lo[o] .. hi[o] - 1 (the visit ranges before pruning). Only those steps
  exist: a grid of every (outer, inner) pair would spend a step (~0.35 us of pipeline
  overhead each on a TPU) on every tile above the causal diagonal, half of them."""
  counts = hi - lo
  outer = np.repeat(np.arange(len(lo)), counts)
  inner = np.concatenate([np.arange(a, b) for a, b in zip(lo, hi)])
  if max(len(lo), int(hi.max())) >= 1 << _INDEX_BITS:
    raise ValueError(f"forgetting_attention: impl='pallas_tpu' takes at most "
                     f"{(1 << _INDEX_BITS) - 1} blocks per sequence; use larger block sizes")
  first = np.r_[True, outer[1:] != outer[:-1]]
  last = np.r_[outer[1:] != outer[:-1], True]
  return ((outer << 16) | (inner << 2) | (last.astype(int) << 1) | first).astype(np.int32)


def _decode(entry):
  """(outer block, streamed block, first step of the outer block, last step) of a step."""
  return entry >> 16, (entry >> 2) & ((1 << _INDEX_BITS) - 1), (entry & 1) == 1, (entry & 2) == 2


def _range_index(b, h, outer, heads, num_outer, per_head):
  """Where the visit range of an outer block sits in the lo/hi tables: per (batch, head)
  when pruning moved them, else per outer block only (SMEM is small)."""
  return (b * heads + h) * num_outer + outer if per_head else outer


def _sweep_step(schedule_ref, lo_ref, hi_ref, *, heads, num_outer, per_head, outer_block,
                inner_block, outer_is_query, window, init, tile, finish):
  """The grid step shared by every kernel, grid (batch, head, step of the schedule).

  Initializes the scratch at an outer block's first step, runs ``tile(q_start, k_start,
  causal, window)`` when the step's streamed block lies in the (pruned) visit range, masked
  where it crosses the diagonal or the window's edge, and writes the outputs at its last step.
  """
  b, h, step = (pl.program_id(axis) for axis in range(3))
  outer, inner, first, last = _decode(schedule_ref[step])
  index = _range_index(b, h, outer, heads, num_outer, per_head)
  live = (inner >= lo_ref[index]) & (inner < hi_ref[index])
  outer_start, inner_start = outer * outer_block, inner * inner_block
  q_start, k_start = (outer_start, inner_start) if outer_is_query else (inner_start, outer_start)
  bq, bk = (outer_block, inner_block) if outer_is_query else (inner_block, outer_block)
  crossing = k_start + bk - 1 > q_start
  if window is not None:
    crossing = crossing | (q_start + bq - 1 - k_start >= window)  # partly outside the band

  pl.when(first)(init)
  pl.when(live & crossing)(lambda: tile(q_start, k_start, True, window))
  pl.when(live & jnp.logical_not(crossing))(lambda: tile(q_start, k_start, False, None))
  pl.when(last)(finish)


# -------------------------------------------------------------------------------- kernels
# Every position vector arrives as a [1, block] row ([B, H, 1, T] in HBM: 4 bytes a position).
# Ref names: *_col are the outer side's, turned into a [block, 1] column inside the kernel
# (``_column``: JAX's splash attention does the same to its lse and di), *_row the streamed
# side's, read as they are; the tile axes are (query, key) except in dK/dV, (key, query). c
# comes as two refs (its high and low parts, decay.py). Outputs (lse, delta, dc) accumulate as
# [block, 128] lane-broadcast columns in VMEM scratch and leave as rows (``_as_row``, once per
# outer block).

def _column(ref):
  """A [1, block] row ref as a [block, 1] column."""
  return jnp.expand_dims(ref[0], -1)


def _as_row(column):
  """A [block, 128] lane-broadcast column (every lane alike) as a [1, block] row: a 2-D
  transpose (the XLU's), then its first row."""
  return jnp.transpose(column)[:1, :]


def _col(refs):
  return decay.TwoFloat(_column(refs[0]), _column(refs[1]))


def _row(refs):
  return decay.TwoFloat(refs[0][...], refs[1][...])


def _forward_kernel(schedule_ref, lo_ref, hi_ref, q_ref, k_ref, v_ref, cq_col, cql_col, sq_col,
                    ck_row, ckl_row, sk_row, o_ref, lse_row, m_sc, l_sc, acc_sc, *, scale, sweep):
  bq, bk = q_ref.shape[0], k_ref.shape[0]

  def init():
    m_sc[...] = jnp.full(m_sc.shape, -jnp.inf, jnp.float32)
    l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
    acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

  def tile(q_start, k_start, causal, window):
    s = tile_logits_2d(_matmul(q_ref[...], k_ref[...], NT), _col((cq_col, cql_col)),
                       _row((ck_row, ckl_row)), _column(sq_col), sk_row[...],
                       _positions(q_start, (bq, 1), 0), _positions(k_start, (1, bk), 1), scale,
                       causal, window)
    m_prev = m_sc[...]  # [bq, 128], every lane alike
    m_new = jnp.maximum(m_prev, s.max(axis=1, keepdims=True))
    m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # rows fully masked so far stay at zero
    p = jnp.exp(s - m_safe[:, :1])
    alpha = jnp.exp(m_prev - m_safe)
    l_sc[...] = alpha * l_sc[...] + p.sum(axis=1, keepdims=True)
    v = v_ref[...]
    acc_sc[...] = alpha[:, :1] * acc_sc[...] + _matmul(p.astype(v.dtype), v, NN)
    m_sc[...] = m_new

  def finish():  # every real row sees itself, so l >= 1 there
    l = l_sc[...]
    o_ref[...] = (acc_sc[...] / l[:, :1]).astype(o_ref.dtype)
    lse_row[...] = _as_row(m_sc[...] + jnp.log(l))

  _sweep_step(schedule_ref, lo_ref, hi_ref, init=init, tile=tile, finish=finish, **sweep)


def _query_tile(q_ref, k_ref, v_ref, cq_cols, sq_col, ck_rows, sk_row, do_ref, lse_col, q_start,
                k_start, causal, window, scale):
  """P and dP = dO V^T of one [query, key] tile (row term and dQ kernels)."""
  bq, bk = q_ref.shape[0], k_ref.shape[0]
  s = tile_logits_2d(_matmul(q_ref[...], k_ref[...], NT), _col(cq_cols), _row(ck_rows),
                     _column(sq_col), sk_row[...], _positions(q_start, (bq, 1), 0),
                     _positions(k_start, (1, bk), 1), scale, causal, window)
  p = jnp.exp(s - _column(lse_col))
  return p, _matmul(do_ref[...], v_ref[...], NT)


def _row_term_kernel(schedule_ref, lo_ref, hi_ref, q_ref, k_ref, v_ref, cq_col, cql_col, sq_col,
                     ck_row, ckl_row, sk_row, do_ref, lse_col, delta_row, delta_sc, *, scale, sweep):
  """delta_i = sum_j P_ij dP_ij over the dQ kernel's tiles (bf16/fp16 inputs; row_term.py)."""
  def init():
    delta_sc[...] = jnp.zeros(delta_sc.shape, jnp.float32)

  def tile(q_start, k_start, causal, window):
    p, dp = _query_tile(q_ref, k_ref, v_ref, (cq_col, cql_col), sq_col, (ck_row, ckl_row), sk_row,
                        do_ref, lse_col, q_start, k_start, causal, window, scale)
    delta_sc[...] += jnp.sum(p * dp, axis=1, keepdims=True)

  def finish():
    delta_row[...] = _as_row(delta_sc[...])

  _sweep_step(schedule_ref, lo_ref, hi_ref, init=init, tile=tile, finish=finish, **sweep)


def _dq_kernel(schedule_ref, lo_ref, hi_ref, q_ref, k_ref, v_ref, cq_col, cql_col, sq_col, ck_row,
               ckl_row, sk_row, do_ref, lse_col, delta_col, dq_ref, dq_sc, *, scale, sweep):
  def init():
    dq_sc[...] = jnp.zeros(dq_sc.shape, jnp.float32)

  def tile(q_start, k_start, causal, window):
    p, dp = _query_tile(q_ref, k_ref, v_ref, (cq_col, cql_col), sq_col, (ck_row, ckl_row), sk_row,
                        do_ref, lse_col, q_start, k_start, causal, window, scale)
    ds = p * (dp - _column(delta_col))
    k = k_ref[...]
    dq_sc[...] += _matmul(ds.astype(k.dtype), k, NN)

  def finish():
    dq_ref[...] = (dq_sc[...] * scale).astype(dq_ref.dtype)

  _sweep_step(schedule_ref, lo_ref, hi_ref, init=init, tile=tile, finish=finish, **sweep)


def _dkv_kernel(schedule_ref, lo_ref, hi_ref, q_ref, k_ref, v_ref, cq_row, cql_row, sq_row, ck_col,
                ckl_col, sk_col, do_ref, lse_row, delta_row, dk_ref, dv_ref, dc_row, dk_sc, dv_sc,
                dc_sc, *, scale, sweep):
  """dK, dV and dc_j = -sum_i dS_ij of one key block, on transposed tiles S^T [key, query]."""
  bq, bk = q_ref.shape[0], k_ref.shape[0]

  def init():
    for ref in (dk_sc, dv_sc, dc_sc):
      ref[...] = jnp.zeros(ref.shape, jnp.float32)

  def tile(q_start, k_start, causal, window):
    q, do = q_ref[...], do_ref[...]
    s_t = tile_logits_2d(_matmul(k_ref[...], q, NT), _row((cq_row, cql_row)), _col((ck_col, ckl_col)),
                         sq_row[...], _column(sk_col), _positions(q_start, (1, bq), 1),
                         _positions(k_start, (bk, 1), 0), scale, causal, window)
    p_t = jnp.exp(s_t - lse_row[...])
    dv_sc[...] += _matmul(p_t.astype(do.dtype), do, NN)
    ds_t = p_t * (_matmul(v_ref[...], do, NT) - delta_row[...])
    dk_sc[...] += _matmul(ds_t.astype(q.dtype), q, NN)
    dc_sc[...] -= ds_t.sum(axis=1, keepdims=True)  # [bk, 128], every lane alike

  def finish():
    dk_ref[...] = (dk_sc[...] * scale).astype(dk_ref.dtype)
    dv_ref[...] = dv_sc[...].astype(dv_ref.dtype)
    dc_row[...] = _as_row(dc_sc[...])

  _sweep_step(schedule_ref, lo_ref, hi_ref, init=init, tile=tile, finish=finish, **sweep)


# ------------------------------------------------------------------------------ pallas_calls

def vectors(x):
  """[B, H, T] -> [B, H, 1, T], the layout of every position vector (of each part of a
  two-float c), outer or streamed side alike: a reshape, nothing broadcast in HBM."""
  return decay.tree_map(lambda x: x[:, :, None, :], x)


def _interpret_mode(interpret):
  return pltpu.InterpretParams() if interpret is True else interpret


class _Sweep:
  """Block specs of one sweep: outer blocks of ``outer_block`` rows, streamed blocks of
  ``inner_block`` over the steps of its schedule, within the visit ranges [lo, hi) (scalar
  prefetch operands: the schedule, lo, hi)."""

  def __init__(self, ranges, outer_block, inner_block, head_dim, outer_is_query, window,
               pruned):
    lo, hi, static_lo, static_hi = ranges
    batch, heads, num_outer = lo.shape
    steps = schedule(static_lo, static_hi)
    if not pruned:  # the ranges are the same in every (batch, head)
      lo, hi = (jnp.asarray(x, jnp.int32) for x in (static_lo, static_hi))
    self.prefetch = (jnp.asarray(steps), lo.reshape(-1), hi.reshape(-1))
    self.grid = (batch, heads, len(steps))
    self.outer_block, self.inner_block, self.head_dim = outer_block, inner_block, head_dim
    self.params = dict(heads=heads, num_outer=num_outer, per_head=pruned,
                       outer_block=outer_block, inner_block=inner_block,
                       outer_is_query=outer_is_query, window=window)

    def outer(step, schedule_ref, *_):
      return _decode(schedule_ref[step])[0]

    def inner(b, h, step, schedule_ref, lo_ref, hi_ref):
      # The streamed block, clamped into the pruned range: a pruned step fetches the block
      # that the next (or last) live step reads, so no block is copied for nothing.
      o, i = _decode(schedule_ref[step])[:2]
      index = _range_index(b, h, o, heads, num_outer, pruned)
      return jnp.minimum(jnp.maximum(i, lo_ref[index]), hi_ref[index] - 1)
    self._outer, self._inner = outer, inner

  def outer(self, group=1):
    """An outer-side [B, H, T, D] block; ``group`` > 1: of a k/v operand, whose head h // group
    query head h reads (gqa.py)."""
    return pl.BlockSpec((None, None, self.outer_block, self.head_dim),
                        lambda b, h, step, *refs: (b, kv_head(h, group), self._outer(step, *refs), 0))

  def inner_seq(self, group=1):
    return pl.BlockSpec((None, None, self.inner_block, self.head_dim),
                        lambda b, h, step, *refs: (b, kv_head(h, group), self._inner(b, h, step, *refs), 0))

  def inner_row(self):
    """A streamed-side vector's [1, block] of its [B, H, 1, T] array."""
    return pl.BlockSpec((None, None, 1, self.inner_block),
                        lambda b, h, step, *refs: (b, h, 0, self._inner(b, h, step, *refs)))

  def outer_row(self):
    """An outer-side vector's [1, block] of its [B, H, 1, T] array (the kernel makes it a
    column)."""
    return pl.BlockSpec((None, None, 1, self.outer_block),
                        lambda b, h, step, *refs: (b, h, 0, self._outer(step, *refs)))

  def call(self, kernel, in_specs, out_specs, out_shape, scratch, interpret, name, *args, **kw):
    return pl.pallas_call(
        functools.partial(kernel, sweep=self.params, **kw),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=3, grid=self.grid, in_specs=in_specs, out_specs=out_specs,
            scratch_shapes=[pltpu.VMEM(shape, jnp.float32) for shape in scratch]),
        out_shape=out_shape,
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=(_PARALLEL, _PARALLEL, _ARBITRARY)),
        interpret=_interpret_mode(interpret),
        name=name,
    )(*self.prefetch, *args)


def _vector(q):
  """A [B, H, 1, T] float32 output (lse, delta, dc) for q [B, H, T, D]."""
  return jax.ShapeDtypeStruct((q.shape[0], q.shape[1], 1, q.shape[2]), jnp.float32)


def _forward(q, k, v, c, seg, threshold, sm_scale, sizes, interpret, window):
  """o [B, H, T, D] in q.dtype and lse [B, H, T] float32."""
  batch, heads, seq_len, head_dim = q.shape
  group = heads // k.shape[1]
  bq, bk = sizes.block_q, sizes.block_k
  sweep = _Sweep(key_ranges(c, threshold, bq, bk, window), bq, bk, head_dim, True, window,
                 threshold is not None)
  cs = (*vectors(c), vectors(seg))
  o, lse = sweep.call(
      _forward_kernel,
      [sweep.outer(), sweep.inner_seq(group), sweep.inner_seq(group)] + [sweep.outer_row()] * 3
      + [sweep.inner_row()] * 3,
      [sweep.outer(), sweep.outer_row()],
      [jax.ShapeDtypeStruct(q.shape, q.dtype), _vector(q)],
      [(bq, LANES), (bq, LANES), (bq, head_dim)], interpret, "forgetting_attention_tpu_fwd",
      q, k, v, *cs, *cs, scale=sm_scale)
  return o, lse[:, :, 0]


def _query_sweep_inputs(sweep, group):
  """Specs of q, k, v, c/seg (columns, rows), dO, lse and delta for the row term and dQ."""
  col, row = sweep.outer_row(), sweep.inner_row()
  return [sweep.outer(), sweep.inner_seq(group), sweep.inner_seq(group), col, col, col, row, row, row,
          sweep.outer(), col, col]


def _row_term(q, k, v, c, seg, threshold, do, lse, sm_scale, sizes, interpret, window):
  """delta [B, H, T] float32 recomputed from the tiles, over the dQ kernel's grid and tiles."""
  batch, heads, seq_len, head_dim = q.shape
  bq, bk = sizes.block_q_dq, sizes.block_k_dq
  sweep = _Sweep(key_ranges(c, threshold, bq, bk, window), bq, bk, head_dim, True, window,
                 threshold is not None)
  cs = (*vectors(c), vectors(seg))
  delta = sweep.call(
      _row_term_kernel, _query_sweep_inputs(sweep, heads // k.shape[1])[:-1], sweep.outer_row(),
      _vector(q), [(bq, LANES)], interpret, "forgetting_attention_tpu_row_term",
      q, k, v, *cs, *cs, do, vectors(lse), scale=sm_scale)
  return delta[:, :, 0]


def _backward(q, k, v, c, seg, threshold, do, lse, delta, sm_scale, sizes, interpret, window):
  """dq [B, HQ, T, D], dk, dv [B, H, T, D] and dc [B, HQ, T] float32."""
  batch, heads, seq_len, head_dim = q.shape
  group = heads // k.shape[1]

  # dK, dV per query head (float32 when a group shares them), summed over the group below
  bq, bk = sizes.block_q_dkv, sizes.block_k_dkv
  sweep = _Sweep(query_ranges(c, threshold, bq, bk, window), bk, bq, head_dim, False, window,
                 threshold is not None)
  col, row = sweep.outer_row(), sweep.inner_row()
  share = lambda x: jax.ShapeDtypeStruct(q.shape, x.dtype if group == 1 else jnp.float32)
  cs = (*vectors(c), vectors(seg))
  dk, dv, dc = sweep.call(
      _dkv_kernel,
      [sweep.inner_seq(), sweep.outer(group=group), sweep.outer(group=group), row, row, row, col, col, col,
       sweep.inner_seq(), row, row],
      [sweep.outer(), sweep.outer(), col],
      [share(k), share(v), _vector(q)],
      [(bk, head_dim), (bk, head_dim), (bk, LANES)], interpret, "forgetting_attention_tpu_dkv",
      q, k, v, *cs, *cs, do, vectors(lse), vectors(delta), scale=sm_scale)

  bq, bk = sizes.block_q_dq, sizes.block_k_dq
  sweep = _Sweep(key_ranges(c, threshold, bq, bk, window), bq, bk, head_dim, True, window,
                 threshold is not None)
  dq = sweep.call(
      _dq_kernel, _query_sweep_inputs(sweep, group), sweep.outer(), jax.ShapeDtypeStruct(q.shape, q.dtype),
      [(bq, head_dim)], interpret, "forgetting_attention_tpu_dq",
      q, k, v, *cs, *cs, do, vectors(lse), vectors(delta), scale=sm_scale)
  return dq, group_sum(dk, group, 1, k.dtype), group_sum(dv, group, 1, v.dtype), dc[:, :, 0]


# static = (sm_scale, sizes, interpret, window); the custom_vjp is the one in vjp.py
_attention = differentiable(BackendKernels(
    cumsum=lambda log_fgate: decay.cumsum(log_fgate, axis=-1), forward=_forward, row_term=_row_term,
    row_term_from_output=row_term.from_output, backward=_backward, seq_axis=2))


def pallas_tpu_attention(q, k, v, log_fgate, segment_ids, sm_scale, block_sizes=None,
                         interpret=False, prune_threshold=None, window=None):
  """TPU backend; layouts as in ``forgetting_attention``. Pads T up to the block sizes.

  ``interpret``: True runs Pallas' TPU interpret mode (CPU tests); a ``pltpu.InterpretParams``
  is passed through. ``prune_threshold`` [batch, heads] (or None) enables tile skipping
  (pruning.py); ``window``: None or a static int, sliding-window attention.
  """
  seq_len, head_dim = q.shape[1], q.shape[-1]
  require_head_dim("pallas_tpu", head_dim, SUPPORTED_HEAD_DIMS)
  if not interpret and not on_tpu():
    raise ValueError("forgetting_attention: impl='pallas_tpu' needs a TPU; on CPU pass "
                     "interpret=True (slow, for tests) or use impl='xla'")
  sizes = tpu_block_sizes(block_sizes, seq_len, q.dtype, head_dim)
  padded_len = padded_length(seq_len, sizes.largest)
  # Padded keys lie right of every real query, so the causal mask already hides them.
  o = _attention(*(heads_major(x, padded_len) for x in (q, k, v, log_fgate, segment_ids)),
                 prune_threshold, (float(sm_scale), sizes, interpret, window))
  return jnp.swapaxes(o, 1, 2)[:, :seq_len]


# Interpreted, each compile takes seconds and most of the suite's shapes fit in one of its
# 128-wide tiles: it sits out the tests whose point is the tiling.
register_backend(Backend("pallas_tpu", pallas_tpu_attention, platforms=("tpu",), interpretable=True,
                         head_dims=SUPPORTED_HEAD_DIMS, priority=20,
                         suite_skips={"small_tiles": "tests/kernels/test_pallas_tpu.py runs it at TPU-sized tiles"}))

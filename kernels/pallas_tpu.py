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

The kernel bodies, the grid step they share and the schedule's step format are in
pallas_tpu_kernels.py (code on VMEM refs, per grid step); this module holds what runs in JAX
around them: tile sizes, the visit ranges, the block specs, the pallas_calls, the custom_vjp
and the backend's registration.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from . import decay, row_term
from .backends import Backend, register_backend
from .target import target_platform
from .vjp import BackendKernels, differentiable
from .gqa import group_sum, kv_head
from .block_sizes import (BlockSizes, first_key_block_in_window, heads_major, padded_length,
                          query_block_end_in_window, require_head_dim)
from .pallas_tpu_kernels import (decode_step, dkv_kernel, forward_kernel, query_sweep_kernel,
                                 range_index, schedule)
from .pallas_tpu_kernels import tile_logits_2d  # noqa: F401 (still pallas_tpu's name: the tests use it)

# Powers of two that the (8, 128) tiling takes as a full last block dim. 64 and smaller pad to
# 128 lanes inside the tiles (the MXU sees 128); lowering for TPU was checked on CPU for each.
SUPPORTED_HEAD_DIMS = (16, 32, 64, 128, 256)
LANES, SUBLANES = 128, 8
# VMEM that the default tiles may fill: 3/4 of the default scoped limit of v5e (16 MiB; v6e
# has 32), leaving room for what the estimate below leaves out.
VMEM_BUDGET_BYTES = 12 * 2**20
_PARALLEL, _ARBITRARY = "parallel", "arbitrary"


def on_tpu():
  """Whether un-interpreted kernels can be built: on a TPU, or compiling for an absent one
  (target.py; tests also patch this to lower for TPU on CPU)."""
  return target_platform() == "tpu"


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
  """A block_sizes.py bound (numpy: its inputs are numpy constants) as an int numpy array shaped
  like ``like``."""
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
  hi = _static(query_block_end_in_window(k_start, bk, bq, num_q_blocks, window), lo)
  shape = (batch, heads, len(k_start))
  if threshold is None:
    hi_blocks = jnp.broadcast_to(jnp.asarray(hi, jnp.int32), shape)
  else:
    after = np.arange(num_q_blocks)[None, :] >= hi[:, None]  # [nk, nq]: below the window
    skip = jnp.swapaxes(_block_gaps(c, bq, bk), -1, -2) < threshold[:, :, None, None]
    hi_blocks = (num_q_blocks - _leading_run((after | skip)[..., ::-1])).astype(jnp.int32)
  return jnp.broadcast_to(jnp.asarray(lo, jnp.int32), shape), hi_blocks, lo, hi


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
      return decode_step(schedule_ref[step])[0]

    def inner(b, h, step, schedule_ref, lo_ref, hi_ref):
      # The streamed block, clamped into the pruned range: a pruned step fetches the block
      # that the next (or last) live step reads, so no block is copied for nothing.
      o, i = decode_step(schedule_ref[step])[:2]
      index = range_index(b, h, o, heads, num_outer, pruned)
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
      forward_kernel,
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
      query_sweep_kernel, _query_sweep_inputs(sweep, heads // k.shape[1])[:-1], sweep.outer_row(),
      _vector(q), [(bq, LANES)], interpret, "forgetting_attention_tpu_row_term",
      q, k, v, *cs, *cs, do, vectors(lse), scale=sm_scale, row_term=True)
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
      dkv_kernel,
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
      query_sweep_kernel, _query_sweep_inputs(sweep, group), sweep.outer(), jax.ShapeDtypeStruct(q.shape, q.dtype),
      [(bq, head_dim)], interpret, "forgetting_attention_tpu_dq",
      q, k, v, *cs, *cs, do, vectors(lse), vectors(delta), scale=sm_scale, row_term=False)
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

"""Forgetting attention as Pallas kernels that lower through Triton (NVIDIA GPUs).

Same algorithm as the blockwise XLA backend, as kernels with no [T, T] array in HBM:

* forward, one program per (query block, batch, head): online softmax over the key blocks left
  of and on the causal diagonal; writes o and the log-normalizer;
* dK/dV/dc, one program per (key block, batch, head): sweeps the query blocks from the diagonal
  down; dc_j = -sum_i dS_ij (column sums of dS);
* dQ, one program per (query block, batch, head);
* with bf16/fp16 inputs, before both backward kernels: the row term delta_i = sum_j P_ij dP_ij,
  one program per (query block, batch, head) over the dQ kernel's tiles (row_term.py says why
  it is not read off the output there).

d log_fgate is then the reverse cumsum of dc, outside the kernels. No atomics are needed. Each
sweep runs in two loops: tiles wholly on one side of the causal diagonal skip the position
compare (and are the only ones pruning may skip); tiles that cross it are masked. A sliding
``window`` (a static int) bounds each sweep to the blocks its band reaches, so tiles wholly
outside it are never loaded, and adds a third loop for the off-diagonal tiles it only partly
covers, which compare positions against the band.
Logits are kept in base-2 units (scaled by log2 e) so the exponentials are exp2, which Triton
maps to the fast hardware instruction. c = cumsum(log f) arrives as decay.py's two float32
parts (c = hi + lo, two [batch, heads, seq] vectors, natural units); each tile forms
c_i - c_j from the parts and only then scales it by log2 e, so no large float32 number is
ever subtracted or rounded (decay.py states the bound). The pruning threshold stays in natural
units too, against the high parts.

Block pairs (gpu_calls.py). Every kernel reads the rows' and the columns' c, segment ids and
global first positions separately (the program's own side through a block spec, the swept
side whole), and its loop bounds come from the global positions (block_sizes.py's ranges),
so the same kernels serve one device (the sequence with itself, offsets 0) and the
context-parallel ring's chunk pairs (``pair_kernels`` on the Backend entry). One device is a
compile-time special case (``Static.pair`` False): one whole set of vectors serves both sides
and there is no offsets operand, so its kernels keep the registers they had before the pairs
(measured with the compile check of the day, benchmarks/compile_check.py's predecessor). On one device q,
k, v and o stay in the caller's [batch, seq, heads, head_dim] layout (block specs pick one
head per program); the ring's chunks are heads-major [batch, heads, seq, head_dim], which
only the block specs see. The per-position vectors (c, segment ids, lse, delta, dc) are
[batch, heads, seq]; the offsets one [2, 16] int32 operand (row 0 the rows', row 1 the
columns', broadcast like the threshold: a vector read, no scalar load). A row that sees no
key of a pair gets o = 0 and lse = -inf.

Grouped-query attention (gqa.py): the grid runs over query heads, and the block specs of k
and v pick key/value head ``h // G`` for query head h (no repeat of K/V in memory). The dK/dV
kernel keeps one program per (key block, batch, query head) and writes that query head's share
of dK, dV in float32; the wrapper then sums each group's G shares (``gqa.group_sum``). That
costs, during the backward only, G float32 copies of K and of V (a fused group loop inside the
kernel would avoid them; not done yet). G = 1 keeps the previous kernels and outputs exactly.

On CPU the kernels run with ``interpret=True`` (what the tests do).
"""

import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from .backends import Backend, register_backend

from .block_sizes import BlockSizes, key_block_ranges, query_block_ranges, tiles_for
from . import decay
from .gpu_calls import LOG2_E, GpuKernels, Shapes, grad_scale, pair_kernels, single_device
from .gqa import kv_head
from .pruning import unless_skipped
from .target import target_platform
from .reference import tile_logits

try:  # the Triton compiler parameters exist only where Pallas GPU is built in
  from jax.experimental.pallas import triton as plgpu
except ImportError:  # pragma: no cover
  plgpu = None

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
MIN_BLOCK = 16  # Triton's dot needs tiles of at least 16 x 16
THRESHOLD_WIDTH = 16  # the threshold and the offsets travel broadcast to 16 lanes


# Tiles and (num_warps, num_stages) per kernel, by (float32 inputs, head dim > 64), chosen from what
# ptxas reports for sm_90a (benchmarks/compile_check.py, docs/compile_check.md): for bf16/fp16
# the largest that leave every kernel without register spills, grouped K/V, a window, segments
# and pruning included. The official FoX kernel's H100 tiles, which these were until Dec 2026,
# spill there: at d = 128 the forward (128 x 128: 100 B), dQ (488 B), row term and dK/dV (64 x 64,
# 4 warps: 1,048 B); at d = 64 dK/dV (128 x 64, 4 warps: 2,240 B with grouped K/V). float32
# inputs multiply in IEEE float32 on the CUDA cores (Triton's FMA dot keeps both operand tiles in
# registers, no tensor cores): the 16-bit tiles spill 4-55 KB there and at d = 128 do not even
# fit shared memory (296 KiB asked); small tiles with many warps spill nothing at d = 64 and,
# the least of those tried at d = 128, 520 B (dK/dV) and 56 B (dQ). The row term (bf16/fp16
# only) runs the dQ kernel's tiles and launch shape.
TILES = {
    (False, False): (BlockSizes(128, 64, 32, 64, 128, 64), {"fwd": (8, 3), "dkv": (4, 3), "dq": (8, 3)}),
    (False, True): (BlockSizes(128, 64, 32, 64, 128, 64), {"fwd": (8, 3), "dkv": (8, 2), "dq": (8, 3)}),
    (True, False): (BlockSizes(32, 32, 16, 16, 32, 32), {"fwd": (8, 2), "dkv": (4, 1), "dq": (8, 2)}),
    (True, True): (BlockSizes(16, 32, 16, 16, 16, 16), {"fwd": (8, 2), "dkv": (8, 1), "dq": (8, 1)}),
}


def default_block_sizes(head_dim, dtype=jnp.bfloat16):
  """The default tiles for ``head_dim`` and the inputs' ``dtype`` (``TILES``)."""
  return tiles_for(TILES, head_dim, dtype)[0]


def fit_block_sizes(block_sizes, seq_len, head_dim, dtype=jnp.bfloat16):
  """``block_sizes`` (default: ``default_block_sizes``) fitted to seq_len, at least 16."""
  return (block_sizes or default_block_sizes(head_dim, dtype)).fitted(seq_len, minimum=MIN_BLOCK)


def _dot(a, b):
  """a @ b accumulated in float32. float32 inputs multiply in IEEE float32 (Triton would use
  TF32 by default); bf16/fp16 inputs are unaffected by the precision flag."""
  return jnp.dot(a, b, precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)


def on_gpu():
  """Whether un-interpreted kernels can be built: on a GPU, or compiling for an absent one
  (target.py; tests also patch this to lower for CUDA on CPU)."""
  return target_platform() == "gpu"


def check_runnable(interpret):
  if not interpret and not on_gpu():
    raise ValueError("forgetting_attention: impl='pallas' needs a GPU; on CPU pass interpret=True "
                     "(slow, for tests) or use impl='xla'")


def _compiler_params(head_dim, dtype, kernel):
  if plgpu is None:
    return None
  warps, stages = tiles_for(TILES, head_dim, dtype)[1][kernel]
  return plgpu.CompilerParams(num_warps=warps, num_stages=stages)


def _tile_logits2(q, k, c_q, c_k, seg_q, seg_k, q_start, k_start, scale2, causal, window):
  """Base-2 logits of one tile, -inf where masked: (scale q.k + c_i - c_j) * log2 e.

  The formula and masks are the reference's ``tile_logits`` (plain jnp, which Triton lowers),
  fed with scale times log2 e and two-float c's, whose difference it scales by log2 e. Only
  the dot product is this kernel's own (2-D tiles, full float32 precision), and so are the
  exponentials that follow: exp2 against a base-2 lse here, where the XLA backend uses exp
  against a natural-log lse. Only tiles that cross the diagonal (``causal``) or the window's
  edge (``window`` not None) compare positions; the others lie wholly inside the band.
  q_start, k_start are global positions.
  """
  return tile_logits(_dot(q, k.T), c_q, c_k, seg_q, seg_k, scale2, q_start, k_start, causal,
                     window, bias_scale=LOG2_E)


def _read_c(c_refs, rows):
  """c of the positions ``rows`` from its two refs (high and low float32 parts)."""
  return decay.TwoFloat(c_refs[0][rows], c_refs[1][rows])


class _Side(NamedTuple):
  """One side's position refs: c's two parts and the segment ids."""

  c: tuple
  seg: object


def _refs(refs, pair):
  """The refs every kernel reads after q, k, v as (rows, columns, threshold, offsets), and the
  rest. A pair: rows' c, c_lo, ids (blocks or whole, by the program's side), columns' c, c_lo,
  ids, threshold, offsets. One device: one whole set of c, c_lo, ids for both sides and the
  threshold; offsets None (0): fewer live pointers, as before the pairs (the kernels' registers)."""
  if pair:
    return _Side(refs[0:2], refs[2]), _Side(refs[3:5], refs[5]), refs[6], refs[7], refs[8:]
  side = _Side(refs[0:2], refs[2])
  return side, side, refs[3], None, refs[4:]


class _Block(NamedTuple):
  """This program's own block: ``start`` its first global position, ``rel`` that minus the
  swept side's first position, ``other`` the swept side's first position, its c and ids, and
  the skip threshold of this (batch, head) (None: pruning off)."""

  start: jax.Array
  rel: jax.Array
  other: jax.Array
  c: decay.TwoFloat
  seg: jax.Array
  thr: Optional[jax.Array]


def _program_block(block, own, own_side, thr_ref, off_ref, prune):
  """What every kernel reads first; ``own`` 0 for a query-block program, 1 for a key block.
  A pair's own side comes as this block's refs; one device's (``off_ref`` None) whole."""
  thr = jnp.max(thr_ref[...]) if prune else None
  if off_ref is None:
    start = pl.program_id(0) * block
    rows = pl.ds(start, block)
    return _Block(start, start, 0, _read_c(own_side.c, rows), own_side.seg[rows], thr)
  offsets = (jnp.max(off_ref[0, :]), jnp.max(off_ref[1, :]))
  start = offsets[own] + pl.program_id(0) * block
  return _Block(start, start - offsets[1 - own], offsets[1 - own], _read_c(own_side.c, ...),
                own_side.seg[...], thr)


def _dscores(p, do, v, delta):
  """dS = P * (dP - delta) of one tile, dP = dO V^T (both backward kernels). P stays outside:
  the dK/dV kernel accumulates dV from P before forming dS, as FlashAttention-2 does."""
  return p * (_dot(do, v.T) - delta[:, None])


def _block_loop(tile, c_refs, block, offset, lo, hi, carry, *, causal, band=None, thr=None,
                tile_gates=None):
  """``carry = tile(global start, block slice, c of the block, causal, band, carry)`` over
  blocks [lo, hi) of the side that moves, whose first position is ``offset``; ``band`` (None,
  or the window) says whether the tiles need the window's mask. With a pruning threshold,
  ``tile_gates(c of the block)`` gives the tile's (c of its rows, c of its columns) and a tile
  that may be skipped is."""
  def body(i, carry):
    local = i * block
    rows = pl.ds(local, block)
    c_block = _read_c(c_refs, rows)
    compute = lambda carry: tile(offset + local, rows, c_block, causal, band, carry)
    if thr is None:
      return compute(carry)
    return unless_skipped(thr, *tile_gates(c_block), compute, carry)
  return lax.fori_loop(lo, hi, body, carry)


def _key_sweep(tile, cols, own, bq, bk, window, carry):
  """The key blocks of one query block (block_sizes.key_block_ranges): those wholly left of
  the diagonal get no causal mask and may be pruned; the ones crossing it, up to the block's
  last query, are masked and never pruned (see pruning.py). A window starts the sweep at the
  first key block it reaches, and the blocks it covers only in part get its mask; so do the
  crossing blocks (the band may end inside them)."""
  first, inside, crossing, end = key_block_ranges(own.rel, bq, bk, cols.c[0].shape[0] // bk, window)
  left = dict(causal=False, thr=own.thr, tile_gates=lambda c_k: (own.c, c_k))
  if window is not None:
    carry = _block_loop(tile, cols.c, bk, own.other, first, inside, carry, band=window, **left)
  carry = _block_loop(tile, cols.c, bk, own.other, inside, crossing, carry, **left)
  return _block_loop(tile, cols.c, bk, own.other, crossing, end, carry, causal=True, band=window)


def _forward_kernel(q_ref, k_ref, v_ref, *refs, scale2, bq, bk, prune, window, pair):
  rows, cols, thr_ref, off_ref, (o_ref, lse_ref) = _refs(refs, pair)
  q = q_ref[...]
  own = _program_block(bq, 0, rows, thr_ref, off_ref, prune)

  def tile(k_start, keys, c_k, causal, band, carry):
    m, l, acc = carry
    s = _tile_logits2(q, k_ref[keys, :], own.c, c_k, own.seg, cols.seg[keys], own.start, k_start,
                      scale2, causal, band)
    m_new = jnp.maximum(m, s.max(axis=-1))
    m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # rows fully masked so far stay at zero
    p = jnp.exp2(s - m_safe[:, None])
    alpha = jnp.exp2(m - m_safe)
    v = v_ref[keys, :]
    pv = _dot(p.astype(v.dtype), v)
    return m_new, alpha * l + p.sum(axis=-1), alpha[:, None] * acc + pv

  init = (jnp.full((bq,), -jnp.inf, jnp.float32), jnp.zeros((bq,), jnp.float32),
          jnp.zeros(q.shape, jnp.float32))
  m, l, acc = _key_sweep(tile, cols, own, bq, bk, window, init)
  # On one device every real row sees itself (l >= 1); a row of a pair may see no key.
  seen = l > 0
  l_safe = jnp.where(seen, l, 1.0)
  o_ref[...] = (acc / l_safe[:, None]).astype(o_ref.dtype)
  lse_ref[...] = jnp.where(seen, m + jnp.log2(l_safe), -jnp.inf)  # base 2


def _dkv_kernel(q_ref, k_ref, v_ref, *refs, scale2, grad_scale, bq, bk, prune, window, pair):
  rows, cols, thr_ref, off_ref, (do_ref, lse_ref, delta_ref, dk_ref, dv_ref, dc_ref) = _refs(refs, pair)
  k, v = k_ref[...], v_ref[...]
  own = _program_block(bk, 1, cols, thr_ref, off_ref, prune)

  def tile(q_start, block_rows, c_q, causal, band, carry):
    dk, dv, dc = carry
    q, do = q_ref[block_rows, :], do_ref[block_rows, :]
    s = _tile_logits2(q, k, c_q, own.c, rows.seg[block_rows], own.seg, q_start, own.start, scale2,
                      causal, band)
    p = jnp.exp2(s - lse_ref[block_rows][:, None])
    dv = dv + _dot(p.astype(do.dtype).T, do)
    ds = _dscores(p, do, v, delta_ref[block_rows])
    dk = dk + _dot(ds.astype(q.dtype).T, q)
    return dk, dv, dc - ds.sum(axis=0)

  # Query blocks above the diagonal see nothing of this key block; those below it need no
  # causal mask and may be pruned; a window ends the sweep after the last query block it
  # reaches, and the blocks it covers only in part get its mask (block_sizes.query_block_ranges).
  first, below, partial, end = query_block_ranges(own.rel, bq, bk, rows.c[0].shape[0] // bq, window)
  zeros = jnp.zeros(k.shape, jnp.float32)
  carry = _block_loop(tile, rows.c, bq, own.other, first, below,
                      (zeros, zeros, jnp.zeros((bk,), jnp.float32)), causal=True, band=window)
  below_opts = dict(causal=False, thr=own.thr, tile_gates=lambda c_q: (c_q, own.c))
  carry = _block_loop(tile, rows.c, bq, own.other, below, partial, carry, **below_opts)
  if window is not None:
    carry = _block_loop(tile, rows.c, bq, own.other, partial, end, carry, band=window, **below_opts)
  dk, dv, dc = carry
  dk_ref[...] = (dk * grad_scale).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)
  dc_ref[...] = dc


def _dq_kernel(q_ref, k_ref, v_ref, *refs, scale2, grad_scale, bq, bk, prune, window, pair):
  rows, cols, thr_ref, off_ref, (do_ref, lse_ref, delta_ref, dq_ref) = _refs(refs, pair)
  q, do, lse, delta = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...]
  own = _program_block(bq, 0, rows, thr_ref, off_ref, prune)

  def tile(k_start, keys, c_k, causal, band, dq):
    k = k_ref[keys, :]
    s = _tile_logits2(q, k, own.c, c_k, own.seg, cols.seg[keys], own.start, k_start, scale2,
                      causal, band)
    p = jnp.exp2(s - lse[:, None])
    ds = _dscores(p, do, v_ref[keys, :], delta)
    return dq + _dot(ds.astype(k.dtype), k)

  dq = _key_sweep(tile, cols, own, bq, bk, window, jnp.zeros(q.shape, jnp.float32))
  dq_ref[...] = (dq * grad_scale).astype(dq_ref.dtype)


def _row_term_kernel(q_ref, k_ref, v_ref, *refs, scale2, bq, bk, prune, window, pair):
  """delta_i = sum_j P_ij dP_ij over the dQ kernel's tiles (bf16/fp16 inputs; row_term.py)."""
  rows, cols, thr_ref, off_ref, (do_ref, lse_ref, delta_ref) = _refs(refs, pair)
  q, do, lse = q_ref[...], do_ref[...], lse_ref[...]
  own = _program_block(bq, 0, rows, thr_ref, off_ref, prune)

  def tile(k_start, keys, c_k, causal, band, delta):
    s = _tile_logits2(q, k_ref[keys, :], own.c, c_k, own.seg, cols.seg[keys], own.start, k_start,
                      scale2, causal, band)
    p = jnp.exp2(s - lse[:, None])
    return delta + jnp.sum(p * _dot(do, v_ref[keys, :].T), axis=-1)

  delta_ref[...] = _key_sweep(tile, cols, own, bq, bk, window, jnp.zeros((bq,), jnp.float32))


# Block specs over grid (block index, batch, query head).

def _seq_spec(rows, head_dim, heads_major, group=1, whole=False):
  """One head's [rows, D] of a q/k/v-shaped operand, [B, T, H, D] (one device) or [B, H, T, D]
  (``heads_major``: the ring's chunks): block i of the grid's first axis, or with ``whole``
  the whole sequence (rows = T). ``group`` > 1: a k/v operand with H = HQ / group heads, of
  which query head h reads head h // group (gqa.py)."""
  block = (lambda i: 0) if whole else (lambda i: i)
  if heads_major:
    return pl.BlockSpec((None, None, rows, head_dim), lambda i, b, h: (b, kv_head(h, group), block(i), 0))
  return pl.BlockSpec((None, rows, None, head_dim), lambda i, b, h: (b, block(i), kv_head(h, group), 0))


def _vec_block(block):  # [B, H, T] -> [block]
  return pl.BlockSpec((None, None, block), lambda i, b, h: (b, h, i))


def _vec_full(seq_len):  # [B, H, T] -> [T]
  return pl.BlockSpec((None, None, seq_len), lambda i, b, h: (b, h, 0))


def _seq(shapes, rows, group=1, whole=False):
  return _seq_spec(rows, shapes.head_dim, shapes.heads_major, group, whole)


def _sides(shapes, rows, cols):
  """Specs of the position vectors and threshold (and a pair's offsets): ``rows``, ``cols``
  those of each side's three vectors; one device has one whole set (``_refs``)."""
  if not shapes.heads_major:
    return [_vec_full(shapes.q_len)] * 3 + [_vec_full(THRESHOLD_WIDTH)]
  return [rows] * 3 + [cols] * 3 + [_vec_full(THRESHOLD_WIDTH), _OFFSETS]


def _by_query_block(shapes, bq):
  """In-specs of a query-block program: q's block, k, v whole, the rows' vectors as blocks,
  the columns' whole, threshold, offsets."""
  kv = _seq(shapes, shapes.k_len, shapes.group, whole=True)
  return [_seq(shapes, bq), kv, kv] + _sides(shapes, _vec_block(bq), _vec_full(shapes.k_len))


def _by_key_block(shapes, bk):
  """In-specs of the dK/dV program: q whole, k, v blocks, the rows' vectors whole, the columns'
  as blocks, threshold, offsets; then dO, lse, delta whole."""
  q_whole = _seq(shapes, shapes.q_len, whole=True)
  return ([q_whole, _seq(shapes, bk, shapes.group), _seq(shapes, bk, shapes.group)]
          + _sides(shapes, _vec_full(shapes.q_len), _vec_block(bk))
          + [q_whole, _vec_full(shapes.q_len), _vec_full(shapes.q_len)])


_OFFSETS = pl.BlockSpec((2, THRESHOLD_WIDTH), lambda i, b, h: (0, 0))


def _operands(q, k, v, ops, static):
  thr = jnp.broadcast_to(ops.thr[..., None], ops.thr.shape + (THRESHOLD_WIDTH,))
  if not static.pair:  # one device: the columns are the rows, at offset 0
    return (q, k, v, ops.c_q.hi, ops.c_q.lo, ops.seg_q, thr)
  offsets = jnp.broadcast_to(ops.offsets[:, None], (2, THRESHOLD_WIDTH))
  return (q, k, v, ops.c_q.hi, ops.c_q.lo, ops.seg_q, ops.c_k.hi, ops.c_k.lo, ops.seg_k, thr, offsets)


def _options(static, bq, bk, grads=False):
  options = dict(scale2=static.sm_scale * LOG2_E, bq=bq, bk=bk, prune=static.prune, window=static.window,
                 pair=static.pair)
  if grads:
    options["grad_scale"] = grad_scale(static)
  return options


def _call(kernel, name, shapes, grid, in_specs, out_specs, out_shape, static, which, dtype):
  """``which`` kernel's pallas_call, launched as ``TILES`` says for the inputs' ``dtype``."""
  return pl.pallas_call(kernel, grid=(grid, shapes.batch, shapes.heads), in_specs=in_specs,
                        out_specs=out_specs, out_shape=out_shape,
                        compiler_params=_compiler_params(shapes.head_dim, dtype, which),
                        interpret=static.interpret, name=f"forgetting_attention_{name}")


def _forward(q, k, v, ops, static):
  """o (q's dtype; float32 for a pair) and the base-2 lse [B, H, Tq]."""
  shapes = Shapes.of(q, k, static)
  bq, bk = static.sizes.block_q, static.sizes.block_k
  kernel = functools.partial(_forward_kernel, **_options(static, bq, bk))
  return _call(kernel, "fwd", shapes, shapes.q_len // bq, _by_query_block(shapes, bq),
               [_seq(shapes, bq), _vec_block(bq)], [shapes.like(q, q.dtype), shapes.vector(shapes.q_len)],
               static, "fwd", q.dtype)(*_operands(q, k, v, ops, static))


def _row_term(q, k, v, ops, do, lse2, static):
  """delta [B, H, Tq] float32 recomputed from the tiles, with the dQ kernel's grid and tiles."""
  shapes = Shapes.of(q, k, static)
  bq, bk = static.sizes.block_q_dq, static.sizes.block_k_dq
  kernel = functools.partial(_row_term_kernel, **_options(static, bq, bk))
  return _call(kernel, "row_term", shapes, shapes.q_len // bq,
               _by_query_block(shapes, bq) + [_seq(shapes, bq), _vec_block(bq)], _vec_block(bq),
               shapes.vector(shapes.q_len), static, "dq", q.dtype)(*_operands(q, k, v, ops, static), do, lse2)


def _backward_dq(q, k, v, ops, do, lse2, delta, static):
  """dq: q's dtype, times sm_scale; for a pair float32 and unscaled."""
  shapes = Shapes.of(q, k, static)
  bq, bk = static.sizes.block_q_dq, static.sizes.block_k_dq
  kernel = functools.partial(_dq_kernel, **_options(static, bq, bk, grads=True))
  return _call(kernel, "dq", shapes, shapes.q_len // bq,
               _by_query_block(shapes, bq) + [_seq(shapes, bq), _vec_block(bq), _vec_block(bq)],
               _seq(shapes, bq), shapes.like(q, q.dtype), static, "dq", q.dtype,
               )(*_operands(q, k, v, ops, static), do, lse2, delta)


def _backward_dkv(q, k, v, ops, do, lse2, delta, static):
  """dK, dV (one share per query head from the kernel, summed over each group here) and dc
  [B, H, Tk]."""
  shapes = Shapes.of(q, k, static)
  bq, bk = static.sizes.block_q_dkv, static.sizes.block_k_dkv
  kernel = functools.partial(_dkv_kernel, **_options(static, bq, bk, grads=True))
  dk, dv, dc = _call(kernel, "dkv", shapes, shapes.k_len // bk, _by_key_block(shapes, bk),
                     [_seq(shapes, bk), _seq(shapes, bk), _vec_block(bk)],
                     [shapes.key_shares(k), shapes.key_shares(v), shapes.vector(shapes.k_len)], static,
                     "dkv", q.dtype)(*_operands(q, k, v, ops, static), do, lse2, delta)
  return shapes.summed(dk, k), shapes.summed(dv, v), dc


KERNELS = GpuKernels(_forward, _row_term, _backward_dq, _backward_dkv)
pallas_attention = single_device(KERNELS, "pallas", SUPPORTED_HEAD_DIMS, fit_block_sizes, check_runnable)


register_backend(Backend("pallas", pallas_attention, platforms=("gpu",), interpretable=True,
                         head_dims=SUPPORTED_HEAD_DIMS, dtypes=("bfloat16", "float16", "float32"), priority=20,
                         pair_kernels=pair_kernels(KERNELS, fit_block_sizes, check_runnable)))

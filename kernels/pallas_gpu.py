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
units too, against the high parts. q, k, v and o stay in the caller's
[batch, seq, heads, head_dim] layout (block specs pick one head per program); the per-position
vectors (c, segment ids, lse, delta, dc) are [batch, heads, seq].

Grouped-query attention (gqa.py): the grid runs over query heads, and the block specs of k
and v pick key/value head ``h // G`` for query head h (no repeat of K/V in memory). The dK/dV
kernel keeps one program per (key block, batch, query head) and writes that query head's share
of dK, dV in float32; the wrapper then sums each group's G shares (``gqa.group_sum``). That
costs, during the backward only, G float32 copies of K and of V (a fused group loop inside the
kernel would avoid them; not done yet). G = 1 keeps the previous kernels and outputs exactly.

On CPU the kernels run with ``interpret=True`` (what the tests do).
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from .backends import Backend, register_backend

from .block_sizes import (BlockSizes, first_key_block_in_window, floor_div, heads_major, pad_seq,
                          padded_length, query_block_end_in_window, require_head_dim)
from . import decay, row_term
from .gqa import group_sum, kv_head
from .pruning import unless_skipped
from .reference import tile_logits
from .vjp import BackendKernels, differentiable

try:  # the Triton compiler parameters exist only where Pallas GPU is built in
  from jax.experimental.pallas import triton as plgpu
except ImportError:  # pragma: no cover
  plgpu = None

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
LOG2_E = math.log2(math.e)
MIN_BLOCK = 16  # Triton's dot needs tiles of at least 16 x 16
THRESHOLD_WIDTH = 16


def default_block_sizes(head_dim):
  """The official FoX kernel's H100/H200 tiles (REFERENCE.md), per head dim."""
  if head_dim <= 64:
    return BlockSizes(block_q=128, block_k=64, block_q_dkv=128, block_k_dkv=64,
                      block_q_dq=128, block_k_dq=128)
  return BlockSizes(block_q=128, block_k=128, block_q_dkv=64, block_k_dkv=64,
                    block_q_dq=128, block_k_dq=128)


def _dot(a, b):
  """a @ b accumulated in float32. float32 inputs multiply in IEEE float32 (Triton would use
  TF32 by default); bf16/fp16 inputs are unaffected by the precision flag."""
  return jnp.dot(a, b, precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)


def on_gpu():
  """Whether un-interpreted kernels can run here (tests patch this to lower for CUDA on CPU)."""
  return jax.default_backend() == "gpu"


def _compiler_params(head_dim, kernel):
  if plgpu is None:
    return None
  warps = {"fwd": 8, "dkv": 4, "dq": 8}[kernel]
  stages = {"fwd": 3 if head_dim <= 64 else 2, "dkv": 3 if head_dim <= 64 else 2,
            "dq": 4 if head_dim <= 64 else 2}[kernel]
  return plgpu.CompilerParams(num_warps=warps, num_stages=stages)


def _tile_logits2(q, k, c_q, c_k, seg_q, seg_k, q_start, k_start, scale2, causal, window):
  """Base-2 logits of one tile, -inf where masked: (scale q.k + c_i - c_j) * log2 e.

  The formula and masks are the reference's ``tile_logits`` (plain jnp, which Triton lowers),
  fed with scale times log2 e and two-float c's, whose difference it scales by log2 e. Only
  the dot product is this kernel's own (2-D tiles, full float32 precision), and so are the
  exponentials that follow: exp2 against a base-2 lse here, where the XLA backend uses exp
  against a natural-log lse. Only tiles that
  cross the diagonal (``causal``) or the window's edge (``window`` not None) compare positions;
  the others lie wholly inside the band.
  """
  return tile_logits(_dot(q, k.T), c_q, c_k, seg_q, seg_k, scale2, q_start, k_start, causal,
                     window, bias_scale=LOG2_E)


def _read_c(c_refs, rows):
  """c of the positions ``rows`` from its two refs (high and low float32 parts)."""
  return decay.TwoFloat(c_refs[0][rows], c_refs[1][rows])


def _program_block(block, c_refs, seg_ref, thr_ref, prune):
  """What every kernel reads first: the start of this program's block (query block in the
  forward and dQ kernels, key block in dK/dV), the block's c and segment ids, and the skip
  threshold of this (batch, head), or None when pruning is off."""
  start = pl.program_id(0) * block
  rows = pl.ds(start, block)
  return start, _read_c(c_refs, rows), seg_ref[rows], jnp.max(thr_ref[...]) if prune else None


def _dscores(p, do, v, delta):
  """dS = P * (dP - delta) of one tile, dP = dO V^T (both backward kernels). P stays outside:
  the dK/dV kernel accumulates dV from P before forming dS, as FlashAttention-2 does."""
  return p * (_dot(do, v.T) - delta[:, None])


def _block_loop(tile, c_refs, block, lo, hi, carry, *, causal, band=None, thr=None,
                tile_gates=None):
  """``carry = tile(start, block slice, c of the block, causal, band, carry)`` over blocks
  [lo, hi) of the side that moves; ``band`` (None, or the window) says whether the tiles need
  the window's mask. With a pruning threshold, ``tile_gates(c of the block)`` gives the tile's
  (c of its rows, c of its columns) and a tile that may be skipped is."""
  def body(i, carry):
    rows = pl.ds(i * block, block)
    c_block = _read_c(c_refs, rows)
    compute = lambda carry: tile(i * block, rows, c_block, causal, band, carry)
    if thr is None:
      return compute(carry)
    return unless_skipped(thr, *tile_gates(c_block), compute, carry)
  return lax.fori_loop(lo, hi, body, carry)


def _key_sweep(tile, c_refs, c_q, thr, q_start, bq, bk, window, carry):
  """The key blocks of one query block: [0, q_start // bk) lie wholly left of the diagonal (no
  causal mask, may be pruned); the rest, up to the block's last query, cross it (masked, never
  pruned: see pruning.py). A window starts the sweep at the first key block it reaches, and
  the blocks left of the diagonal before ceil((q_start + bq - window) / bk), which it covers
  only in part, get its mask; so do the crossing blocks (the band may end inside them)."""
  first_crossing = floor_div(q_start, bk)
  left = dict(causal=False, thr=thr, tile_gates=lambda c_k: (c_q, c_k))
  first_inside = 0
  if window is not None:
    first = first_key_block_in_window(q_start, bk, window)
    first_inside = jnp.minimum(floor_div(jnp.maximum(q_start + bq - window, 0) + bk - 1, bk),
                               first_crossing)
    carry = _block_loop(tile, c_refs, bk, first, first_inside, carry, band=window, **left)
  carry = _block_loop(tile, c_refs, bk, first_inside, first_crossing, carry, **left)
  return _block_loop(tile, c_refs, bk, first_crossing, floor_div(q_start + bq + bk - 1, bk), carry,
                     causal=True, band=window)


def _forward_kernel(q_ref, k_ref, v_ref, c_ref, clo_ref, seg_ref, thr_ref, o_ref, lse_ref, *, scale2, bq,
                    bk, prune, window):
  q, c_refs = q_ref[...], (c_ref, clo_ref)
  q_start, c_q, seg_q, thr = _program_block(bq, c_refs, seg_ref, thr_ref, prune)

  def tile(k_start, keys, c_k, causal, band, carry):
    m, l, acc = carry
    s = _tile_logits2(q, k_ref[keys, :], c_q, c_k, seg_q, seg_ref[keys], q_start, k_start, scale2,
                      causal, band)
    m_new = jnp.maximum(m, s.max(axis=-1))
    m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # rows fully masked so far stay at zero
    p = jnp.exp2(s - m_safe[:, None])
    alpha = jnp.exp2(m - m_safe)
    v = v_ref[keys, :]
    pv = _dot(p.astype(v.dtype), v)
    return m_new, alpha * l + p.sum(axis=-1), alpha[:, None] * acc + pv

  init = (jnp.full((bq,), -jnp.inf, jnp.float32), jnp.zeros((bq,), jnp.float32),
          jnp.zeros(q.shape, jnp.float32))
  m, l, acc = _key_sweep(tile, c_refs, c_q, thr, q_start, bq, bk, window, init)
  o_ref[...] = (acc / l[:, None]).astype(o_ref.dtype)
  lse_ref[...] = m + jnp.log2(l)  # base 2; every real row has l >= 1


def _dkv_kernel(q_ref, k_ref, v_ref, c_ref, clo_ref, seg_ref, thr_ref, do_ref, lse_ref, delta_ref,
                dk_ref, dv_ref, dc_ref, *, scale2, sm_scale, bq, bk, seq_len, prune, window):
  k, v, c_refs = k_ref[...], v_ref[...], (c_ref, clo_ref)
  k_start, c_k, seg_k, thr = _program_block(bk, c_refs, seg_ref, thr_ref, prune)

  def tile(q_start, rows, c_q, causal, band, carry):
    dk, dv, dc = carry
    q, do = q_ref[rows, :], do_ref[rows, :]
    s = _tile_logits2(q, k, c_q, c_k, seg_ref[rows], seg_k, q_start, k_start, scale2, causal,
                      band)
    p = jnp.exp2(s - lse_ref[rows][:, None])
    dv = dv + _dot(p.astype(do.dtype).T, do)
    ds = _dscores(p, do, v, delta_ref[rows])
    dk = dk + _dot(ds.astype(q.dtype).T, q)
    return dk, dv, dc - ds.sum(axis=0)

  # Query blocks above the diagonal see nothing of this key block; those from
  # ceil((k_start + bk) / bq) on lie wholly below it (no causal mask, may be pruned). The padded
  # length is a multiple of every block size, so that index is at most seq_len // bq.
  # A window ends the sweep after the last query block it reaches from this key block, and the
  # blocks below the diagonal from (k_start + window) // bq on, which it covers only in part,
  # get its mask; so do the crossing blocks.
  num_q_blocks = seq_len // bq
  first_below = floor_div(k_start + bk + bq - 1, bq)
  end = query_block_end_in_window(k_start, bk, bq, num_q_blocks, window)
  zeros = jnp.zeros(k.shape, jnp.float32)
  carry = _block_loop(tile, c_refs, bq, floor_div(k_start, bq), first_below,
                      (zeros, zeros, jnp.zeros((bk,), jnp.float32)), causal=True, band=window)
  below = dict(causal=False, thr=thr, tile_gates=lambda c_q: (c_q, c_k))
  if window is None:
    dk, dv, dc = _block_loop(tile, c_refs, bq, first_below, end, carry, **below)
  else:
    first_partial = jnp.maximum(jnp.minimum(floor_div(k_start + window, bq), end), first_below)
    carry = _block_loop(tile, c_refs, bq, first_below, first_partial, carry, **below)
    dk, dv, dc = _block_loop(tile, c_refs, bq, first_partial, end, carry, band=window, **below)
  dk_ref[...] = (dk * sm_scale).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)
  dc_ref[...] = dc


def _dq_kernel(q_ref, k_ref, v_ref, c_ref, clo_ref, seg_ref, thr_ref, do_ref, lse_ref, delta_ref, dq_ref,
               *, scale2, sm_scale, bq, bk, prune, window):
  q, do, lse, delta = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...]
  c_refs = (c_ref, clo_ref)
  q_start, c_q, seg_q, thr = _program_block(bq, c_refs, seg_ref, thr_ref, prune)

  def tile(k_start, keys, c_k, causal, band, dq):
    k = k_ref[keys, :]
    s = _tile_logits2(q, k, c_q, c_k, seg_q, seg_ref[keys], q_start, k_start, scale2, causal,
                      band)
    p = jnp.exp2(s - lse[:, None])
    ds = _dscores(p, do, v_ref[keys, :], delta)
    return dq + _dot(ds.astype(k.dtype), k)

  dq = _key_sweep(tile, c_refs, c_q, thr, q_start, bq, bk, window, jnp.zeros(q.shape, jnp.float32))
  dq_ref[...] = (dq * sm_scale).astype(dq_ref.dtype)


def _row_term_kernel(q_ref, k_ref, v_ref, c_ref, clo_ref, seg_ref, thr_ref, do_ref, lse_ref, delta_ref,
                     *, scale2, bq, bk, prune, window):
  """delta_i = sum_j P_ij dP_ij over the dQ kernel's tiles (bf16/fp16 inputs; row_term.py)."""
  q, do, lse, c_refs = q_ref[...], do_ref[...], lse_ref[...], (c_ref, clo_ref)
  q_start, c_q, seg_q, thr = _program_block(bq, c_refs, seg_ref, thr_ref, prune)

  def tile(k_start, keys, c_k, causal, band, delta):
    s = _tile_logits2(q, k_ref[keys, :], c_q, c_k, seg_q, seg_ref[keys], q_start, k_start, scale2,
                      causal, band)
    p = jnp.exp2(s - lse[:, None])
    return delta + jnp.sum(p * _dot(do, v_ref[keys, :].T), axis=-1)

  delta_ref[...] = _key_sweep(tile, c_refs, c_q, thr, q_start, bq, bk, window,
                              jnp.zeros((bq,), jnp.float32))


# Block specs over grid (block index, batch, query head). ``group`` > 1: a k/v operand with
# H = HQ / group heads, of which query head h reads head h // group (gqa.py).
def _seq_block(block, head_dim, group=1):  # [B, T, H, D] -> one [block, D] tile of one head
  return pl.BlockSpec((None, block, None, head_dim), lambda i, b, h: (b, i, kv_head(h, group), 0))


def _seq_full(seq_len, head_dim, group=1):  # [B, T, H, D] -> the whole sequence of one head
  return pl.BlockSpec((None, seq_len, None, head_dim), lambda i, b, h: (b, 0, kv_head(h, group), 0))


def _vec_block(block):  # [B, H, T] -> [block]
  return pl.BlockSpec((None, None, block), lambda i, b, h: (b, h, i))


def _vec_full(seq_len):  # [B, H, T] -> [T]
  return pl.BlockSpec((None, None, seq_len), lambda i, b, h: (b, h, 0))


def _forward(q, k, v, c, seg, thr2, sm_scale, sizes, interpret, prune, window):
  batch, seq_len, heads, head_dim = q.shape
  group = heads // k.shape[2]
  bq, bk = sizes.block_q, sizes.block_k
  kernel = functools.partial(_forward_kernel, scale2=sm_scale * LOG2_E, bq=bq, bk=bk, prune=prune,
                             window=window)
  kv = _seq_full(seq_len, head_dim, group)
  return pl.pallas_call(
      kernel,
      grid=(seq_len // bq, batch, heads),
      in_specs=[_seq_block(bq, head_dim), kv, kv,
                _vec_full(seq_len), _vec_full(seq_len), _vec_full(seq_len), _vec_full(THRESHOLD_WIDTH)],
      out_specs=[_seq_block(bq, head_dim), _vec_block(bq)],
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((batch, heads, seq_len), jnp.float32)],
      compiler_params=_compiler_params(head_dim, "fwd"),
      interpret=interpret,
      name="forgetting_attention_fwd",
  )(q, k, v, c.hi, c.lo, seg, thr2)


def _row_term(q, k, v, c, seg, thr2, do, lse2, sm_scale, sizes, interpret, prune, window):
  """delta [B, H, T] float32 recomputed from the tiles, with the dQ kernel's grid and tiles."""
  batch, seq_len, heads, head_dim = q.shape
  full, vec = _seq_full(seq_len, head_dim, heads // k.shape[2]), _vec_full(seq_len)
  bq, bk = sizes.block_q_dq, sizes.block_k_dq
  return pl.pallas_call(
      functools.partial(_row_term_kernel, scale2=sm_scale * LOG2_E, bq=bq, bk=bk, prune=prune,
                        window=window),
      grid=(seq_len // bq, batch, heads),
      in_specs=[_seq_block(bq, head_dim), full, full, vec, vec, vec, _vec_full(THRESHOLD_WIDTH),
                _seq_block(bq, head_dim), _vec_block(bq)],
      out_specs=_vec_block(bq),
      out_shape=jax.ShapeDtypeStruct((batch, heads, seq_len), jnp.float32),
      compiler_params=_compiler_params(head_dim, "dq"),
      interpret=interpret,
      name="forgetting_attention_row_term",
  )(q, k, v, c.hi, c.lo, seg, thr2, do, lse2)


def _backward(q, k, v, c, seg, thr2, do, lse2, delta, sm_scale, sizes, interpret, prune, window):
  batch, seq_len, heads, head_dim = q.shape
  group = heads // k.shape[2]
  full, vec, thr = _seq_full(seq_len, head_dim), _vec_full(seq_len), _vec_full(THRESHOLD_WIDTH)
  kv_full = _seq_full(seq_len, head_dim, group)
  common = dict(scale2=sm_scale * LOG2_E, sm_scale=sm_scale, prune=prune, window=window)

  # dK, dV per query head (float32 when a group shares them), summed over the group below
  bq, bk = sizes.block_q_dkv, sizes.block_k_dkv
  share = lambda x: jax.ShapeDtypeStruct(q.shape, x.dtype if group == 1 else jnp.float32)
  dk, dv, dc = pl.pallas_call(
      functools.partial(_dkv_kernel, bq=bq, bk=bk, seq_len=seq_len, **common),
      grid=(seq_len // bk, batch, heads),
      in_specs=[full, _seq_block(bk, head_dim, group), _seq_block(bk, head_dim, group), vec, vec, vec, thr,
                full, vec, vec],
      out_specs=[_seq_block(bk, head_dim), _seq_block(bk, head_dim), _vec_block(bk)],
      out_shape=[share(k), share(v), jax.ShapeDtypeStruct((batch, heads, seq_len), jnp.float32)],
      compiler_params=_compiler_params(head_dim, "dkv"),
      interpret=interpret,
      name="forgetting_attention_dkv",
  )(q, k, v, c.hi, c.lo, seg, thr2, do, lse2, delta)

  bq, bk = sizes.block_q_dq, sizes.block_k_dq
  dq = pl.pallas_call(
      functools.partial(_dq_kernel, bq=bq, bk=bk, **common),
      grid=(seq_len // bq, batch, heads),
      in_specs=[_seq_block(bq, head_dim), kv_full, kv_full, vec, vec, vec, thr, _seq_block(bq, head_dim),
                _vec_block(bq), _vec_block(bq)],
      out_specs=_seq_block(bq, head_dim),
      out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
      compiler_params=_compiler_params(head_dim, "dq"),
      interpret=interpret,
      name="forgetting_attention_dq",
  )(q, k, v, c.hi, c.lo, seg, thr2, do, lse2, delta)
  return dq, group_sum(dk, group, 2, k.dtype), group_sum(dv, group, 2, v.dtype), dc


def _decay_cumsum(log_fgate):
  """c of [B, H, T] log f: decay.py's two float32 parts, natural units (the tiles scale their
  c_i - c_j by log2 e)."""
  return decay.cumsum(log_fgate, axis=-1)


def _row_term_from_output(o, do):
  """delta [B, H, T] from o, dO [B, T, H, D] (the layout the Pallas and Triton kernels keep)."""
  return jnp.swapaxes(row_term.from_output(o, do), 1, 2)


# static = (sm_scale, sizes, interpret, prune, window)
_pallas = differentiable(BackendKernels(
    cumsum=_decay_cumsum, forward=_forward, row_term=_row_term,
    row_term_from_output=_row_term_from_output, backward=_backward, seq_axis=2))


def pallas_attention(q, k, v, log_fgate, segment_ids, sm_scale, block_sizes=None, interpret=False,
                     prune_threshold=None, window=None):
  """Pallas backend; layouts as in ``forgetting_attention``. Pads T up to the block sizes.

  ``prune_threshold`` [batch, heads] (or None) enables tile skipping (see pruning.py).
  ``window``: None or a static int, sliding-window attention (tiles outside the band skipped).
  """
  seq_len, head_dim = q.shape[1], q.shape[-1]
  require_head_dim("pallas", head_dim, SUPPORTED_HEAD_DIMS)
  if not interpret and not on_gpu():
    raise ValueError("forgetting_attention: impl='pallas' needs a GPU; on CPU pass interpret=True "
                     "(slow, for tests) or use impl='xla'")
  sizes = (block_sizes or default_block_sizes(head_dim)).fitted(seq_len, minimum=MIN_BLOCK)
  padded_len = padded_length(seq_len, sizes.largest)
  prune = prune_threshold is not None
  # The threshold travels as a [B, H, 16] row (a power-of-two block); kernels read its max. It
  # stays in natural units, as c does.
  threshold = prune_threshold if prune else jnp.zeros(q.shape[:1] + q.shape[2:3], jnp.float32)
  thr2 = jnp.broadcast_to(threshold[..., None], threshold.shape + (THRESHOLD_WIDTH,))
  o = _pallas(pad_seq(q, padded_len), pad_seq(k, padded_len), pad_seq(v, padded_len),
              heads_major(log_fgate, padded_len), heads_major(segment_ids, padded_len), thr2,
              (float(sm_scale), sizes, bool(interpret), prune, window))
  return o[:, :seq_len]


register_backend(Backend("pallas", pallas_attention, platforms=("gpu",), interpretable=True,
                         head_dims=SUPPORTED_HEAD_DIMS, dtypes=("bfloat16", "float16", "float32"), priority=20))

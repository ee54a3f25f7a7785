"""The Mosaic kernels of the TPU backend (pallas_tpu.py): the code that runs inside its pallas_calls.

Here: the grid step every kernel shares (``sweep_step``: the scratch zeroed at an outer block's
first step, one masked or unmasked tile when the streamed block lies in the visit range, the
outputs written at the last step), the 2-D tile logits, the refs' row/column helpers, and the
kernel bodies: forward, row term and dQ (one kernel, since they sweep the same tiles), dK/dV/dc.
Also the schedule's packed step format: ``schedule`` writes it (numpy, called by the wrapper)
and ``decode_step`` reads it (the kernels and the block specs' index maps), so both sides of the
bit layout stay together.

Why apart from pallas_tpu.py: this code works on VMEM refs, one grid step at a time, under
Mosaic's layout rules; pallas_tpu.py is what runs in JAX around it (tile sizes, visit ranges,
block specs, the pallas_calls, the custom_vjp, the registration). pallas_tpu.py's docstring
describes the layouts both follow.
"""

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from . import decay


def _matmul(a, b, contract):
  """a . b over dims ``contract`` = (a's, b's), accumulated in float32. Two float32 operands
  multiply in full float32 precision (the MXU's default would round them to bf16); bf16/fp16
  operands at the MXU's native precision, which is exact for them: libtpu's Mosaic rejects a
  float32 contract precision on narrower operands ("Bad lhs type", every TPU). Said explicitly,
  not left to None, which would take jax_default_matmul_precision ("highest" is a common
  setting, and the tests' own) and fail the same way."""
  full = a.dtype == jnp.float32 and b.dtype == jnp.float32
  return lax.dot_general(a, b, ((contract[:1], contract[1:]), ((), ())),
                         precision=lax.Precision.HIGHEST if full else lax.Precision.DEFAULT,
                         preferred_element_type=jnp.float32)


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


def decode_step(entry):
  """(outer block, streamed block, first step of the outer block, last step) of a step."""
  return entry >> 16, (entry >> 2) & ((1 << _INDEX_BITS) - 1), (entry & 1) == 1, (entry & 2) == 2


def range_index(b, h, outer, heads, num_outer, per_head):
  """Where the visit range of an outer block sits in the lo/hi tables: per (batch, head)
  when pruning moved them, else per outer block only (SMEM is small)."""
  return (b * heads + h) * num_outer + outer if per_head else outer


def sweep_step(schedule_ref, lo_ref, hi_ref, *, heads, num_outer, per_head, outer_block,
               inner_block, outer_is_query, window, init, tile, finish):
  """The grid step shared by every kernel, grid (batch, head, step of the schedule).

  Initializes the scratch at an outer block's first step, runs ``tile(q_start, k_start,
  causal, window)`` when the step's streamed block lies in the (pruned) visit range, masked
  where it crosses the diagonal or the window's edge, and writes the outputs at its last step.
  """
  b, h, step = (pl.program_id(axis) for axis in range(3))
  outer, inner, first, last = decode_step(schedule_ref[step])
  index = range_index(b, h, outer, heads, num_outer, per_head)
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


def _query_key_logits(q_ref, k_ref, cq_cols, sq_col, ck_rows, sk_row, q_start, k_start, scale,
                      causal, window):
  """The masked logits of a [query, key] tile (forward, row term and dQ kernels): the outer
  query block's vectors made columns, the streamed key block's read as rows."""
  bq, bk = q_ref.shape[0], k_ref.shape[0]
  return tile_logits_2d(_matmul(q_ref[...], k_ref[...], NT), _col(cq_cols), _row(ck_rows),
                        _column(sq_col), sk_row[...], _positions(q_start, (bq, 1), 0),
                        _positions(k_start, (1, bk), 1), scale, causal, window)


def forward_kernel(schedule_ref, lo_ref, hi_ref, q_ref, k_ref, v_ref, cq_col, cql_col, sq_col,
                   ck_row, ckl_row, sk_row, o_ref, lse_row, m_sc, l_sc, acc_sc, *, scale, sweep):
  def init():
    m_sc[...] = jnp.full(m_sc.shape, -jnp.inf, jnp.float32)
    l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
    acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

  def tile(q_start, k_start, causal, window):
    s = _query_key_logits(q_ref, k_ref, (cq_col, cql_col), sq_col, (ck_row, ckl_row), sk_row,
                          q_start, k_start, scale, causal, window)
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

  sweep_step(schedule_ref, lo_ref, hi_ref, init=init, tile=tile, finish=finish, **sweep)


def query_sweep_kernel(schedule_ref, lo_ref, hi_ref, q_ref, k_ref, v_ref, cq_col, cql_col, sq_col,
                       ck_row, ckl_row, sk_row, do_ref, lse_col, *refs, scale, sweep, row_term):
  """The row term's and dQ's kernel: both run the same sweep over the same tiles (so that the
  recomputed row term matches dQ's P exactly), from P and dP = dO V^T of each tile.

  ``row_term``: delta_i = sum_j P_ij dP_ij (bf16/fp16 inputs; row_term.py), ``refs`` = (its
  output row, a [bq, 128] scratch); else dQ = scale * dS K with dS = P (dP - delta), ``refs`` =
  (delta, the output, a [bq, D] scratch).
  """
  if row_term:
    delta_row, acc_sc = refs
  else:
    delta_col, dq_ref, acc_sc = refs

  def init():
    acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

  def tile(q_start, k_start, causal, window):
    s = _query_key_logits(q_ref, k_ref, (cq_col, cql_col), sq_col, (ck_row, ckl_row), sk_row,
                          q_start, k_start, scale, causal, window)
    p = jnp.exp(s - _column(lse_col))
    dp = _matmul(do_ref[...], v_ref[...], NT)
    if row_term:
      acc_sc[...] += jnp.sum(p * dp, axis=1, keepdims=True)
    else:
      ds = p * (dp - _column(delta_col))
      k = k_ref[...]
      acc_sc[...] += _matmul(ds.astype(k.dtype), k, NN)

  def finish():
    if row_term:
      delta_row[...] = _as_row(acc_sc[...])
    else:
      dq_ref[...] = (acc_sc[...] * scale).astype(dq_ref.dtype)

  sweep_step(schedule_ref, lo_ref, hi_ref, init=init, tile=tile, finish=finish, **sweep)


def dkv_kernel(schedule_ref, lo_ref, hi_ref, q_ref, k_ref, v_ref, cq_row, cql_row, sq_row, ck_col,
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

  sweep_step(schedule_ref, lo_ref, hi_ref, init=init, tile=tile, finish=finish, **sweep)

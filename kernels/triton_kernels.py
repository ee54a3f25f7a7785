"""Forgetting attention as Triton kernels (triton.language only: no JAX, no jax-triton here).

The same algorithm as the Pallas backend (pallas_gpu.py), written directly in Triton so that
JAX can call it through jax-triton (triton_backend.py) instead of Pallas' deprecated Triton
lowering. Four kernels, each one program per (block, batch, head):

* ``forward_kernel`` (query blocks): online softmax over the key blocks the band reaches;
  writes o and the base-2 log-normalizer lse2;
* ``dkv_kernel`` (key blocks): sweeps the query blocks from the diagonal down; dK, dV and
  dc_j = -sum_i dS_ij (column sums of dS), no atomics;
* ``dq_kernel`` (query blocks): dQ;
* ``row_term_kernel`` (query blocks, bf16/fp16 inputs only): delta_i = sum_j P_ij dP_ij over the
  dQ kernel's tiles, in float32 (row_term.py says why it is not read off the output).

Layouts: q, o, dO, dq are [batch, seq, heads, head_dim] (the caller's), k, v
[batch, seq, KV_HEADS, head_dim] (grouped-query attention, gqa.py: query head h reads key/value
head h // (HEADS / KV_HEADS), no repeat in memory), dk, dv the per-query-head shares
[batch, seq, heads, head_dim] that triton_backend.py sums over each group; seq already padded
to a multiple of every block size; the per-position vectors c, clo, seg, lse2,
delta, dc are [batch, heads, seq]; thr is [batch, heads]. c = cumsum(log f) arrives as the two
float32 parts of decay.py (C the high, CLO the low part, natural units), the pruning threshold
thr in natural units too; the logits are base 2 (scale2 = scale * log2 e), so every
exponential is exp2.

Per tile: logits = scale2 * q.k + ((c_i - c_j) + (clo_i - clo_j)) * log2 e, the decay formed
from the two parts before it is scaled (never a difference of two large float32 numbers),
-inf across segments, right of the diagonal (only tiles that cross it compare positions) and,
with a window w > 0, where i - j >= w (only tiles the band's edge crosses). Each sweep runs as
up to three loops (band edge / inside / diagonal); tiles wholly outside the band are never
loaded. Pruning (kernels/pruning.py, the same bound) skips the off-diagonal tiles with
max c_rows - min c_cols < thr (high parts). Because log f <= 0, c never increases along the sequence, so the
tiles a sweep may skip are the ones farthest from the diagonal: a prefix of a query block's key
blocks, a suffix of a key block's query blocks. The kernels therefore move the sweep's bound
(a scalar pass over the blocks' c reads one [block] vector each) instead of branching in the
tile loop, which keeps those loops free of control flow for Triton's software pipelining; for
valid gates they skip exactly the tiles the Pallas backend's per-tile test skips. All shapes are
compile-time constants and there is no autotuning: a launch is deterministic.
"""

import triton
import triton.language as tl

# Tiles, warps and stages are the caller's (triton_backend.default_block_sizes, LAUNCH_SHAPES);
# the kernels take tiles and shapes as constexprs.


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
  """a @ b accumulated in float32; float32 inputs in IEEE float32 (Triton's default is TF32,
  which would miss the float32 tolerances), bf16/fp16 inputs on the tensor cores as they are."""
  if IEEE:
    return tl.dot(a, b, input_precision="ieee")
  else:
    return tl.dot(a, b)


@triton.jit
def _logits(qk, c_q, c_k, clo_q, clo_k, seg_q, seg_k, pos_q, pos_k, scale2, CAUSAL: tl.constexpr,
            WINDOW: tl.constexpr):
  """Masked base-2 logits of a tile; the row/column operands are already expanded to broadcast
  against qk (so one helper serves [rows, cols] tiles and the dK/dV kernel's [cols, rows]).
  The decay comes from the two parts of c first, in natural units, then times log2 e."""
  s = qk * scale2 + ((c_q - c_k) + (clo_q - clo_k)) * 1.4426950408889634
  keep = seg_q == seg_k
  if CAUSAL:
    keep = keep & (pos_q >= pos_k)
  if WINDOW > 0:
    keep = keep & (pos_q - pos_k < WINDOW)
  return tl.where(keep, s, float("-inf"))


@triton.jit
def _key_blocks(q_start, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, WINDOW: tl.constexpr):
  """Key-block ranges of the query block at q_start (block_sizes.py's window rules):
  [first, inside) are crossed by the band's edge, [inside, crossing) lie wholly inside the band
  left of the diagonal, [crossing, end) cross the diagonal. Without a window first = inside = 0."""
  crossing = q_start // BLOCK_K
  end = (q_start + BLOCK_Q + BLOCK_K - 1) // BLOCK_K
  first = crossing * 0
  inside = first
  if WINDOW > 0:
    first = tl.maximum(q_start - WINDOW + 1, 0) // BLOCK_K
    inside = tl.minimum((tl.maximum(q_start + BLOCK_Q - WINDOW, 0) + BLOCK_K - 1) // BLOCK_K,
                        crossing)
  return first, inside, crossing, end


@triton.jit
def _query_blocks(k_start, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, NUM_Q_BLOCKS: tl.constexpr,
                  WINDOW: tl.constexpr):
  """Query-block ranges of the key block at k_start: [first, below) cross the diagonal,
  [below, partial) lie wholly below it inside the band, [partial, end) are crossed by the
  band's edge; the band ends the sweep after the last query block it reaches."""
  first = k_start // BLOCK_Q
  below = (k_start + BLOCK_K + BLOCK_Q - 1) // BLOCK_Q
  end = first * 0 + NUM_Q_BLOCKS
  partial = end
  if WINDOW > 0:
    end = tl.minimum((k_start + BLOCK_K + WINDOW - 2) // BLOCK_Q + 1, NUM_Q_BLOCKS)
    partial = tl.maximum(tl.minimum((k_start + WINDOW) // BLOCK_Q, end), below)
  return first, below, partial, end


@triton.jit
def _first_kept_key_block(C, c_q_max, thr, lo, hi, BLOCK_K: tl.constexpr):
  """The end of the longest run of key blocks [lo, first) that pruning may skip for a query
  block whose largest c is c_q_max: each has max c_q - min c_k < thr (see pruning.py)."""
  first = lo
  for kb in range(lo, hi):
    gap = c_q_max - tl.min(tl.load(C + kb * BLOCK_K + tl.arange(0, BLOCK_K)), 0)
    first = tl.where((gap < thr) & (first == kb), kb + 1, first)
  return first


@triton.jit
def _last_kept_query_block_end(C, c_k_min, thr, lo, hi, BLOCK_Q: tl.constexpr):
  """One past the last query block in [lo, hi) that pruning may not skip for a key block whose
  smallest c is c_k_min (lo when it may skip them all)."""
  end = lo
  for qb in range(lo, hi):
    gap = tl.max(tl.load(C + qb * BLOCK_Q + tl.arange(0, BLOCK_Q)), 0) - c_k_min
    end = tl.where(gap >= thr, qb + 1, end)
  return end


@triton.jit
def _program(THR, SEQ_LEN: tl.constexpr, HEADS: tl.constexpr, KV_HEADS: tl.constexpr,
             HEAD_DIM: tl.constexpr):
  """This program's (batch, query head h): the offset of its sequence in [B, T, HEADS, D] arrays
  (int64: B * T * H * D may pass 2^31), of its key/value head h // (HEADS / KV_HEADS) in
  [B, T, KV_HEADS, D] arrays (gqa.py), of its vectors in [B, HEADS, T] arrays, and its threshold."""
  b, h = tl.program_id(1), tl.program_id(2)
  seq_offset = (b.to(tl.int64) * SEQ_LEN * HEADS + h) * HEAD_DIM
  kv_offset = (b.to(tl.int64) * SEQ_LEN * KV_HEADS + h // (HEADS // KV_HEADS)) * HEAD_DIM
  vec_offset = (b.to(tl.int64) * HEADS + h) * SEQ_LEN
  return seq_offset, kv_offset, vec_offset, tl.load(THR + b * HEADS + h)


@triton.jit
def _rows(start, BLOCK: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr):
  """Offsets of a [BLOCK, HEAD_DIM] tile of one head's rows start.. in [B, T, H, D]."""
  return ((start + tl.arange(0, BLOCK))[:, None] * (HEADS * HEAD_DIM)
          + tl.arange(0, HEAD_DIM)[None, :])


# ----------------------------------------------------------------------------------- forward

@triton.jit
def _forward_tile(acc, m, l, q, c_q, clo_q, seg_q, pos_q, K, V, C, CLO, SEG, k_start, scale2,
                  BLOCK_K: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                  CAUSAL: tl.constexpr, WINDOW: tl.constexpr, IEEE: tl.constexpr):
  pos_k = k_start + tl.arange(0, BLOCK_K)
  k = tl.load(K + _rows(k_start, BLOCK_K, KV_HEADS, HEAD_DIM))
  s = _logits(_dot(q, tl.trans(k), IEEE), c_q[:, None], tl.load(C + pos_k)[None, :],
              clo_q[:, None], tl.load(CLO + pos_k)[None, :], seg_q[:, None],
              tl.load(SEG + pos_k)[None, :], pos_q[:, None], pos_k[None, :], scale2, CAUSAL, WINDOW)
  m_new = tl.maximum(m, tl.max(s, 1))
  m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows fully masked so far stay at zero
  p = tl.exp2(s - m_safe[:, None])
  alpha = tl.exp2(m - m_safe)
  v = tl.load(V + _rows(k_start, BLOCK_K, KV_HEADS, HEAD_DIM))
  acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE)
  return acc, m_new, l * alpha + tl.sum(p, 1)


@triton.jit
def forward_kernel(Q, K, V, C, CLO, SEG, THR, O, LSE, scale2: tl.constexpr, SEQ_LEN: tl.constexpr,
                   HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                   BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, WINDOW: tl.constexpr,
                   PRUNE: tl.constexpr, IEEE: tl.constexpr):
  """o [B, T, H, D] (q.dtype) and lse2 [B, H, T] (float32, base 2) of one query block."""
  seq, kv, vec, thr = _program(THR, SEQ_LEN, HEADS, KV_HEADS, HEAD_DIM)
  Q, K, V, O, SEG, LSE = Q + seq, K + kv, V + kv, O + seq, SEG + vec, LSE + vec
  C, CLO = C + vec, CLO + vec
  q_start = tl.program_id(0) * BLOCK_Q
  pos_q = q_start + tl.arange(0, BLOCK_Q)
  tile = _rows(q_start, BLOCK_Q, HEADS, HEAD_DIM)
  q, c_q, seg_q = tl.load(Q + tile), tl.load(C + pos_q), tl.load(SEG + pos_q)
  clo_q = tl.load(CLO + pos_q)
  acc = tl.zeros((BLOCK_Q, HEAD_DIM), tl.float32)
  m = tl.full((BLOCK_Q,), float("-inf"), tl.float32)
  l = tl.zeros((BLOCK_Q,), tl.float32)
  first, inside, crossing, end = _key_blocks(q_start, BLOCK_Q, BLOCK_K, WINDOW)
  if PRUNE:
    first = _first_kept_key_block(C, tl.max(c_q, 0), thr, first, crossing, BLOCK_K)
    inside = tl.maximum(inside, first)
  for kb in range(first, inside):
    acc, m, l = _forward_tile(acc, m, l, q, c_q, clo_q, seg_q, pos_q, K, V, C, CLO, SEG, kb * BLOCK_K,
                              scale2,
                              BLOCK_K, KV_HEADS, HEAD_DIM, False, WINDOW, IEEE)
  for kb in range(inside, crossing):
    acc, m, l = _forward_tile(acc, m, l, q, c_q, clo_q, seg_q, pos_q, K, V, C, CLO, SEG, kb * BLOCK_K,
                              scale2,
                              BLOCK_K, KV_HEADS, HEAD_DIM, False, 0, IEEE)
  for kb in range(crossing, end):  # the diagonal: never pruned (see pruning.py)
    acc, m, l = _forward_tile(acc, m, l, q, c_q, clo_q, seg_q, pos_q, K, V, C, CLO, SEG, kb * BLOCK_K,
                              scale2,
                              BLOCK_K, KV_HEADS, HEAD_DIM, True, WINDOW, IEEE)
  tl.store(O + tile, (acc / l[:, None]).to(O.dtype.element_ty))
  tl.store(LSE + pos_q, m + tl.log2(l))  # every row sees at least its own key: l >= 1


# ---------------------------------------------------------------------------------- backward

@triton.jit
def _dkv_tile(dk, dv, dc, k, v, c_k, clo_k, seg_k, pos_k, Q, DO, C, CLO, SEG, LSE, DELTA, q_start, scale2,
              BLOCK_Q: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
              CAUSAL: tl.constexpr, WINDOW: tl.constexpr, IEEE: tl.constexpr):
  """Transposed tile [keys, queries], so that dV += P^T dO and dK += dS^T Q need no transpose
  of a [queries, keys] array."""
  pos_q = q_start + tl.arange(0, BLOCK_Q)
  tile = _rows(q_start, BLOCK_Q, HEADS, HEAD_DIM)
  q, do = tl.load(Q + tile), tl.load(DO + tile)
  s_t = _logits(_dot(k, tl.trans(q), IEEE), tl.load(C + pos_q)[None, :], c_k[:, None],
                tl.load(CLO + pos_q)[None, :], clo_k[:, None], tl.load(SEG + pos_q)[None, :],
                seg_k[:, None], pos_q[None, :], pos_k[:, None], scale2, CAUSAL, WINDOW)
  p_t = tl.exp2(s_t - tl.load(LSE + pos_q)[None, :])
  dv += _dot(p_t.to(do.dtype), do, IEEE)
  ds_t = p_t * (_dot(v, tl.trans(do), IEEE) - tl.load(DELTA + pos_q)[None, :])
  dk += _dot(ds_t.to(q.dtype), q, IEEE)
  return dk, dv, dc - tl.sum(ds_t, 1)


@triton.jit
def dkv_kernel(Q, K, V, C, CLO, SEG, THR, DO, LSE, DELTA, DK, DV, DC, scale2: tl.constexpr,
               sm_scale: tl.constexpr, SEQ_LEN: tl.constexpr, HEADS: tl.constexpr,
               KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr,
               BLOCK_K: tl.constexpr, WINDOW: tl.constexpr, PRUNE: tl.constexpr,
               IEEE: tl.constexpr):
  """This query head's dk, dv [B, T, H, D] (its share of its key/value head's gradient) and
  dc [B, H, T] (float32) of one key block."""
  seq, kv, vec, thr = _program(THR, SEQ_LEN, HEADS, KV_HEADS, HEAD_DIM)
  Q, K, V, DO, DK, DV = Q + seq, K + kv, V + kv, DO + seq, DK + seq, DV + seq
  C, CLO, SEG, LSE, DELTA, DC = C + vec, CLO + vec, SEG + vec, LSE + vec, DELTA + vec, DC + vec
  k_start = tl.program_id(0) * BLOCK_K
  pos_k = k_start + tl.arange(0, BLOCK_K)
  tile = _rows(k_start, BLOCK_K, HEADS, HEAD_DIM)
  kv_tile = _rows(k_start, BLOCK_K, KV_HEADS, HEAD_DIM)
  k, v, c_k, seg_k = tl.load(K + kv_tile), tl.load(V + kv_tile), tl.load(C + pos_k), tl.load(SEG + pos_k)
  clo_k = tl.load(CLO + pos_k)
  dk = tl.zeros((BLOCK_K, HEAD_DIM), tl.float32)
  dv = tl.zeros((BLOCK_K, HEAD_DIM), tl.float32)
  dc = tl.zeros((BLOCK_K,), tl.float32)
  first, below, partial, end = _query_blocks(k_start, BLOCK_Q, BLOCK_K, SEQ_LEN // BLOCK_Q, WINDOW)
  if PRUNE:
    end = _last_kept_query_block_end(C, tl.min(c_k, 0), thr, below, end, BLOCK_Q)
    partial = tl.minimum(partial, end)
  for qb in range(first, below):  # the diagonal: never pruned
    dk, dv, dc = _dkv_tile(dk, dv, dc, k, v, c_k, clo_k, seg_k, pos_k, Q, DO, C, CLO, SEG, LSE, DELTA,
                           qb * BLOCK_Q, scale2, BLOCK_Q, HEADS, HEAD_DIM, True, WINDOW, IEEE)
  for qb in range(below, partial):
    dk, dv, dc = _dkv_tile(dk, dv, dc, k, v, c_k, clo_k, seg_k, pos_k, Q, DO, C, CLO, SEG, LSE, DELTA,
                           qb * BLOCK_Q, scale2, BLOCK_Q, HEADS, HEAD_DIM, False, 0, IEEE)
  for qb in range(partial, end):
    dk, dv, dc = _dkv_tile(dk, dv, dc, k, v, c_k, clo_k, seg_k, pos_k, Q, DO, C, CLO, SEG, LSE, DELTA,
                           qb * BLOCK_Q, scale2, BLOCK_Q, HEADS, HEAD_DIM, False, WINDOW, IEEE)
  tl.store(DK + tile, (dk * sm_scale).to(DK.dtype.element_ty))
  tl.store(DV + tile, dv.to(DV.dtype.element_ty))
  tl.store(DC + pos_k, dc)


@triton.jit
def _dq_tile(dq, delta, q, do, c_q, clo_q, seg_q, pos_q, lse, delta_q, K, V, C, CLO, SEG, k_start, scale2,
             BLOCK_K: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
             CAUSAL: tl.constexpr, WINDOW: tl.constexpr, ROW_TERM: tl.constexpr,
             IEEE: tl.constexpr):
  """P and dP of one tile; then dQ += dS K, or (ROW_TERM) only delta += rowsum(P * dP)."""
  pos_k = k_start + tl.arange(0, BLOCK_K)
  tile = _rows(k_start, BLOCK_K, KV_HEADS, HEAD_DIM)
  k = tl.load(K + tile)
  s = _logits(_dot(q, tl.trans(k), IEEE), c_q[:, None], tl.load(C + pos_k)[None, :],
              clo_q[:, None], tl.load(CLO + pos_k)[None, :], seg_q[:, None],
              tl.load(SEG + pos_k)[None, :], pos_q[:, None], pos_k[None, :], scale2, CAUSAL, WINDOW)
  p = tl.exp2(s - lse[:, None])
  dp = _dot(do, tl.trans(tl.load(V + tile)), IEEE)
  if ROW_TERM:
    delta += tl.sum(p * dp, 1)
  else:
    dq += _dot((p * (dp - delta_q[:, None])).to(k.dtype), k, IEEE)
  return dq, delta


@triton.jit
def _query_block_sweep(Q, K, V, C, CLO, SEG, THR, DO, LSE, DELTA, scale2, SEQ_LEN: tl.constexpr,
                       HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                       BLOCK_Q: tl.constexpr,
                       BLOCK_K: tl.constexpr, WINDOW: tl.constexpr, PRUNE: tl.constexpr,
                       ROW_TERM: tl.constexpr, IEEE: tl.constexpr):
  """The key sweep of one query block shared by dq_kernel and row_term_kernel (the same tiles,
  so the recomputed row term matches dQ's P exactly). Returns (dq unscaled, delta, offsets)."""
  seq, kv, vec, thr = _program(THR, SEQ_LEN, HEADS, KV_HEADS, HEAD_DIM)
  Q, K, V, DO = Q + seq, K + kv, V + kv, DO + seq
  C, CLO, SEG, LSE, DELTA = C + vec, CLO + vec, SEG + vec, LSE + vec, DELTA + vec
  q_start = tl.program_id(0) * BLOCK_Q
  pos_q = q_start + tl.arange(0, BLOCK_Q)
  tile = _rows(q_start, BLOCK_Q, HEADS, HEAD_DIM)
  c_q, clo_q = tl.load(C + pos_q), tl.load(CLO + pos_q)
  delta_q = tl.zeros((BLOCK_Q,), tl.float32)
  if not ROW_TERM:
    delta_q = tl.load(DELTA + pos_q)
  q, do = tl.load(Q + tile), tl.load(DO + tile)
  seg_q, lse = tl.load(SEG + pos_q), tl.load(LSE + pos_q)
  dq = tl.zeros((BLOCK_Q, HEAD_DIM), tl.float32)
  delta = tl.zeros((BLOCK_Q,), tl.float32)
  first, inside, crossing, end = _key_blocks(q_start, BLOCK_Q, BLOCK_K, WINDOW)
  if PRUNE:
    first = _first_kept_key_block(C, tl.max(c_q, 0), thr, first, crossing, BLOCK_K)
    inside = tl.maximum(inside, first)
  for kb in range(first, inside):
    dq, delta = _dq_tile(dq, delta, q, do, c_q, clo_q, seg_q, pos_q, lse, delta_q, K, V, C, CLO, SEG,
                         kb * BLOCK_K, scale2, BLOCK_K, KV_HEADS, HEAD_DIM, False, WINDOW, ROW_TERM,
                         IEEE)
  for kb in range(inside, crossing):
    dq, delta = _dq_tile(dq, delta, q, do, c_q, clo_q, seg_q, pos_q, lse, delta_q, K, V, C, CLO, SEG,
                         kb * BLOCK_K, scale2, BLOCK_K, KV_HEADS, HEAD_DIM, False, 0, ROW_TERM, IEEE)
  for kb in range(crossing, end):  # the diagonal: never pruned
    dq, delta = _dq_tile(dq, delta, q, do, c_q, clo_q, seg_q, pos_q, lse, delta_q, K, V, C, CLO, SEG,
                         kb * BLOCK_K, scale2, BLOCK_K, KV_HEADS, HEAD_DIM, True, WINDOW, ROW_TERM,
                         IEEE)
  return dq, delta, seq + tile, vec + pos_q


@triton.jit
def dq_kernel(Q, K, V, C, CLO, SEG, THR, DO, LSE, DELTA, DQ, scale2: tl.constexpr,
              sm_scale: tl.constexpr, SEQ_LEN: tl.constexpr, HEADS: tl.constexpr,
              KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
              WINDOW: tl.constexpr, PRUNE: tl.constexpr, IEEE: tl.constexpr):
  """dq [B, T, H, D] (q.dtype) of one query block."""
  dq, _, rows, _ = _query_block_sweep(Q, K, V, C, CLO, SEG, THR, DO, LSE, DELTA, scale2, SEQ_LEN, HEADS,
                                      KV_HEADS, HEAD_DIM, BLOCK_Q, BLOCK_K, WINDOW, PRUNE, False, IEEE)
  tl.store(DQ + rows, (dq * sm_scale).to(DQ.dtype.element_ty))


@triton.jit
def row_term_kernel(Q, K, V, C, CLO, SEG, THR, DO, LSE, DELTA, scale2: tl.constexpr,
                    SEQ_LEN: tl.constexpr, HEADS: tl.constexpr, KV_HEADS: tl.constexpr,
                    HEAD_DIM: tl.constexpr,
                    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, WINDOW: tl.constexpr,
                    PRUNE: tl.constexpr, IEEE: tl.constexpr):
  """delta [B, H, T] float32 = sum_j P_ij dP_ij of one query block (DELTA is the output)."""
  _, delta, _, positions = _query_block_sweep(
      Q, K, V, C, CLO, SEG, THR, DO, LSE, DELTA, scale2, SEQ_LEN, HEADS, KV_HEADS, HEAD_DIM, BLOCK_Q, BLOCK_K,
      WINDOW, PRUNE, True, IEEE)
  tl.store(DELTA + positions, delta)

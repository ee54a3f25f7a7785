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

Layouts: q, o, dO, dq are [batch, SEQ_Q, heads, head_dim] (the caller's), k, v
[batch, SEQ_K, KV_HEADS, head_dim] (grouped-query attention, gqa.py: query head h reads key/value
head h // (HEADS / KV_HEADS), no repeat in memory), dk, dv the per-query-head shares
[batch, SEQ_K, heads, head_dim] that triton_backend.py sums over each group; with PAIR
(the context-parallel ring's chunks) each of them is [batch, heads, seq, head_dim] instead.
Sequences are already padded to a multiple of every block size. The per-position vectors are
[batch, heads, seq]: the rows' c, clo, seg (C, CLO, SEG) and lse2, delta; the columns' c, clo,
seg (CK, CKLO, SEGK) and dc; thr is [batch, heads]; OFF holds two int32, the global positions
of the first row and of the first column. c = cumsum(log f) arrives as the two float32 parts of
decay.py (C the high, CLO the low part, natural units), the pruning threshold thr in natural
units too; the logits are base 2 (scale2 = scale * log2 e), so every exponential is exp2.

Block pairs (gpu_calls.py): rows and columns may be two different stretches of one sequence.
Loads index each side locally; positions in the masks and the sweeps' block ranges are global
(the offsets added), the ranges clipped to the other side's length, so a pair that causality
or the window rules out runs no tile. One device is the special case PAIR = False, fixed at
compile time: the columns read the rows' vectors (CK, CKLO, SEGK are ignored) and the offsets
are 0 (OFF is not read), which keeps the single-device kernels' registers as they were (the
extra live pointers made the d = 128 kernels spill). A row that sees no key of a pair gets
o = 0 and lse2 = -inf.

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
def _key_blocks(rel, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, NUM_K_BLOCKS: tl.constexpr,
                WINDOW: tl.constexpr):
  """Key-block ranges of a query block whose first row lies ``rel`` positions after the first
  key (block_sizes.key_block_ranges, any sign of rel): [first, inside) are crossed by the band's
  edge, [inside, crossing) lie wholly inside the band left of the diagonal, [crossing, end)
  cross the diagonal. Without a window first = inside = 0."""
  crossing = tl.minimum(tl.maximum(rel, 0) // BLOCK_K, NUM_K_BLOCKS)
  end = tl.minimum((tl.maximum(rel + BLOCK_Q, 0) + BLOCK_K - 1) // BLOCK_K, NUM_K_BLOCKS)
  first = crossing * 0
  inside = first
  if WINDOW > 0:
    first = tl.minimum(tl.maximum(rel - WINDOW + 1, 0) // BLOCK_K, NUM_K_BLOCKS)
    inside = tl.minimum((tl.maximum(rel + BLOCK_Q - WINDOW, 0) + BLOCK_K - 1) // BLOCK_K, crossing)
  return first, inside, crossing, end


@triton.jit
def _query_blocks(rel, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, NUM_Q_BLOCKS: tl.constexpr,
                  WINDOW: tl.constexpr):
  """Query-block ranges of a key block whose first key lies ``rel`` positions after the first
  row (block_sizes.query_block_ranges): [first, below) cross the diagonal, [below, partial) lie
  wholly below it inside the band, [partial, end) are crossed by the band's edge; the band ends
  the sweep after the last query block it reaches."""
  first = tl.minimum(tl.maximum(rel, 0) // BLOCK_Q, NUM_Q_BLOCKS)
  below = tl.minimum((tl.maximum(rel + BLOCK_K, 0) + BLOCK_Q - 1) // BLOCK_Q, NUM_Q_BLOCKS)
  end = first * 0 + NUM_Q_BLOCKS
  partial = end
  if WINDOW > 0:
    last_row = rel + BLOCK_K + WINDOW - 2  # the last row that sees the block's last key
    end = tl.where(last_row < 0, 0, tl.minimum(tl.maximum(last_row, 0) // BLOCK_Q + 1, NUM_Q_BLOCKS))
    partial = tl.maximum(tl.minimum(tl.maximum(rel + WINDOW, 0) // BLOCK_Q, end), below)
  return first, below, partial, end


@triton.jit
def _first_kept_key_block(C, c_q_max, thr, lo, hi, BLOCK_K: tl.constexpr):
  """The end of the longest run of key blocks [lo, first) that pruning may skip for a query
  block whose largest c is c_q_max: each has max c_q - min c_k < thr (see pruning.py). C: the
  columns' c."""
  first = lo
  for kb in range(lo, hi):
    gap = c_q_max - tl.min(tl.load(C + kb * BLOCK_K + tl.arange(0, BLOCK_K)), 0)
    first = tl.where((gap < thr) & (first == kb), kb + 1, first)
  return first


@triton.jit
def _last_kept_query_block_end(C, c_k_min, thr, lo, hi, BLOCK_Q: tl.constexpr):
  """One past the last query block in [lo, hi) that pruning may not skip for a key block whose
  smallest c is c_k_min (lo when it may skip them all). C: the rows' c."""
  end = lo
  for qb in range(lo, hi):
    gap = tl.max(tl.load(C + qb * BLOCK_Q + tl.arange(0, BLOCK_Q)), 0) - c_k_min
    end = tl.where(gap >= thr, qb + 1, end)
  return end


@triton.jit
def _kept_key_blocks(CK, c_q, thr, rel, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                     NUM_K_BLOCKS: tl.constexpr, WINDOW: tl.constexpr, PRUNE: tl.constexpr):
  """A query block's key-block ranges, as the forward, dQ and row-term sweeps run them: those of
  _key_blocks, less (PRUNE) the leading blocks that pruning skips; the diagonal's, [crossing,
  end), are never pruned. c_q: the block's rows' c; CK: the columns'."""
  first, inside, crossing, end = _key_blocks(rel, BLOCK_Q, BLOCK_K, NUM_K_BLOCKS, WINDOW)
  if PRUNE:
    first = _first_kept_key_block(CK, tl.max(c_q, 0), thr, first, crossing, BLOCK_K)
    inside = tl.maximum(inside, first)
  return first, inside, crossing, end


@triton.jit
def _head(b, h, SEQ: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
          PAIR: tl.constexpr):
  """The offset of head h of batch row b in a [B, SEQ, HEADS, D] array ([B, HEADS, SEQ, D] with
  PAIR), int64: B * T * H * D may pass 2^31."""
  if PAIR:
    return (b.to(tl.int64) * HEADS + h) * SEQ * HEAD_DIM
  else:
    return (b.to(tl.int64) * SEQ * HEADS + h) * HEAD_DIM


@triton.jit
def _program(THR, OFF, SEQ_Q: tl.constexpr, SEQ_K: tl.constexpr, HEADS: tl.constexpr,
             KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, PAIR: tl.constexpr):
  """This program's (batch, query head h): the offsets of its sequence in q-shaped arrays, of
  its share in dk/dv-shaped ones (query heads, SEQ_K), of its key/value head h // (HEADS /
  KV_HEADS) in k, v (gqa.py), of its rows' and columns' vectors in [B, HEADS, T] arrays; its
  threshold, and the global positions of the first row and column (0 on one device)."""
  b, h = tl.program_id(1), tl.program_id(2)
  vec = b.to(tl.int64) * HEADS + h
  q_off = 0
  k_off = 0
  if PAIR:
    q_off = tl.load(OFF)
    k_off = tl.load(OFF + 1)
  return (_head(b, h, SEQ_Q, HEADS, HEAD_DIM, PAIR), _head(b, h, SEQ_K, HEADS, HEAD_DIM, PAIR),
          _head(b, h // (HEADS // KV_HEADS), SEQ_K, KV_HEADS, HEAD_DIM, PAIR), vec * SEQ_Q,
          vec * SEQ_K, tl.load(THR + b * HEADS + h), q_off, k_off)


@triton.jit
def _columns(C, CLO, SEG, CK, CKLO, SEGK, PAIR: tl.constexpr):
  """The columns' c, clo and ids: their own for a pair; on one device the rows' (the same
  arrays), which keeps three pointers fewer live (spills at d = 128 otherwise)."""
  if PAIR:
    return CK, CKLO, SEGK
  else:
    return C, CLO, SEG


@triton.jit
def _rows(start, BLOCK: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
          PAIR: tl.constexpr):
  """Offsets of a [BLOCK, HEAD_DIM] tile of one head's rows start.. (local) in [B, T, H, D]
  ([B, H, T, D] with PAIR), from the head's offset."""
  positions = (start + tl.arange(0, BLOCK))[:, None]
  if PAIR:
    return positions * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
  else:
    return positions * (HEADS * HEAD_DIM) + tl.arange(0, HEAD_DIM)[None, :]


# ----------------------------------------------------------------------------------- forward

@triton.jit
def _key_tile(q, c_q, clo_q, seg_q, pos_q, K, CK, CKLO, SEGK, k_local, k_off, scale2,
              BLOCK_K: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
              CAUSAL: tl.constexpr, WINDOW: tl.constexpr, IEEE: tl.constexpr, PAIR: tl.constexpr):
  """A query block's masked base-2 logits [BLOCK_Q, BLOCK_K] against the key tile k_local..
  (local), with that tile's k and its offsets in k/v-shaped arrays (the forward's and dQ's
  sweeps; the dK/dV kernel's transposed tile is its own)."""
  cols = k_local + tl.arange(0, BLOCK_K)
  kv_tile = _rows(k_local, BLOCK_K, KV_HEADS, HEAD_DIM, PAIR)
  k = tl.load(K + kv_tile)
  s = _logits(_dot(q, tl.trans(k), IEEE), c_q[:, None], tl.load(CK + cols)[None, :],
              clo_q[:, None], tl.load(CKLO + cols)[None, :], seg_q[:, None],
              tl.load(SEGK + cols)[None, :], pos_q[:, None], (k_off + cols)[None, :], scale2, CAUSAL,
              WINDOW)
  return s, k, kv_tile


@triton.jit
def _forward_tile(acc, m, l, q, c_q, clo_q, seg_q, pos_q, K, V, CK, CKLO, SEGK, k_local, k_off, scale2,
                  BLOCK_K: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                  CAUSAL: tl.constexpr, WINDOW: tl.constexpr, IEEE: tl.constexpr,
                  PAIR: tl.constexpr):
  s, _, kv_tile = _key_tile(q, c_q, clo_q, seg_q, pos_q, K, CK, CKLO, SEGK, k_local, k_off, scale2, BLOCK_K,
                            KV_HEADS, HEAD_DIM, CAUSAL, WINDOW, IEEE, PAIR)
  m_new = tl.maximum(m, tl.max(s, 1))
  m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows fully masked so far stay at zero
  p = tl.exp2(s - m_safe[:, None])
  alpha = tl.exp2(m - m_safe)
  v = tl.load(V + kv_tile)
  acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE)
  return acc, m_new, l * alpha + tl.sum(p, 1)


@triton.jit
def forward_kernel(Q, K, V, C, CLO, SEG, CK, CKLO, SEGK, THR, OFF, O, LSE, scale2: tl.constexpr,
                   SEQ_Q: tl.constexpr, SEQ_K: tl.constexpr, HEADS: tl.constexpr,
                   KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr,
                   BLOCK_K: tl.constexpr, WINDOW: tl.constexpr, PRUNE: tl.constexpr,
                   IEEE: tl.constexpr, PAIR: tl.constexpr):
  """o (O's dtype) and lse2 [B, H, SEQ_Q] (float32, base 2) of one query block."""
  seq, _, kv, vec_q, vec_k, thr, q_off, k_off = _program(THR, OFF, SEQ_Q, SEQ_K, HEADS, KV_HEADS,
                                                         HEAD_DIM, PAIR)
  Q, O, K, V = Q + seq, O + seq, K + kv, V + kv
  CK, CKLO, SEGK = _columns(C, CLO, SEG, CK, CKLO, SEGK, PAIR)
  C, CLO, SEG, LSE = C + vec_q, CLO + vec_q, SEG + vec_q, LSE + vec_q
  CK, CKLO, SEGK = CK + vec_k, CKLO + vec_k, SEGK + vec_k
  q_local = tl.program_id(0) * BLOCK_Q
  rows = q_local + tl.arange(0, BLOCK_Q)
  pos_q = q_off + rows
  tile = _rows(q_local, BLOCK_Q, HEADS, HEAD_DIM, PAIR)
  q, c_q, seg_q = tl.load(Q + tile), tl.load(C + rows), tl.load(SEG + rows)
  clo_q = tl.load(CLO + rows)
  acc = tl.zeros((BLOCK_Q, HEAD_DIM), tl.float32)
  m = tl.full((BLOCK_Q,), float("-inf"), tl.float32)
  l = tl.zeros((BLOCK_Q,), tl.float32)
  first, inside, crossing, end = _kept_key_blocks(CK, c_q, thr, q_off + q_local - k_off, BLOCK_Q,
                                                  BLOCK_K, SEQ_K // BLOCK_K, WINDOW, PRUNE)
  for kb in range(first, inside):
    acc, m, l = _forward_tile(acc, m, l, q, c_q, clo_q, seg_q, pos_q, K, V, CK, CKLO, SEGK, kb * BLOCK_K,
                              k_off, scale2, BLOCK_K, KV_HEADS, HEAD_DIM, False, WINDOW, IEEE,
                              PAIR)
  for kb in range(inside, crossing):
    acc, m, l = _forward_tile(acc, m, l, q, c_q, clo_q, seg_q, pos_q, K, V, CK, CKLO, SEGK, kb * BLOCK_K,
                              k_off, scale2, BLOCK_K, KV_HEADS, HEAD_DIM, False, 0, IEEE, PAIR)
  for kb in range(crossing, end):  # the diagonal: never pruned (see pruning.py)
    acc, m, l = _forward_tile(acc, m, l, q, c_q, clo_q, seg_q, pos_q, K, V, CK, CKLO, SEGK, kb * BLOCK_K,
                              k_off, scale2, BLOCK_K, KV_HEADS, HEAD_DIM, True, WINDOW, IEEE,
                              PAIR)
  # One device: every real row sees itself (l >= 1); a row of a pair may see no key.
  seen = l > 0
  l_safe = tl.where(seen, l, 1.0)
  tl.store(O + tile, (acc / l_safe[:, None]).to(O.dtype.element_ty))
  tl.store(LSE + rows, tl.where(seen, m + tl.log2(l_safe), float("-inf")))


# ---------------------------------------------------------------------------------- backward

@triton.jit
def _dkv_tile(dk, dv, dc, k, v, c_k, clo_k, seg_k, pos_k, Q, DO, C, CLO, SEG, LSE, DELTA, q_local, q_off,
              scale2, BLOCK_Q: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
              CAUSAL: tl.constexpr, WINDOW: tl.constexpr, IEEE: tl.constexpr,
              PAIR: tl.constexpr):
  """Transposed tile [keys, queries], so that dV += P^T dO and dK += dS^T Q need no transpose
  of a [queries, keys] array."""
  rows = q_local + tl.arange(0, BLOCK_Q)
  tile = _rows(q_local, BLOCK_Q, HEADS, HEAD_DIM, PAIR)
  q, do = tl.load(Q + tile), tl.load(DO + tile)
  s_t = _logits(_dot(k, tl.trans(q), IEEE), tl.load(C + rows)[None, :], c_k[:, None],
                tl.load(CLO + rows)[None, :], clo_k[:, None], tl.load(SEG + rows)[None, :],
                seg_k[:, None], (q_off + rows)[None, :], pos_k[:, None], scale2, CAUSAL, WINDOW)
  p_t = tl.exp2(s_t - tl.load(LSE + rows)[None, :])
  dv += _dot(p_t.to(do.dtype), do, IEEE)
  ds_t = p_t * (_dot(v, tl.trans(do), IEEE) - tl.load(DELTA + rows)[None, :])
  dk += _dot(ds_t.to(q.dtype), q, IEEE)
  return dk, dv, dc - tl.sum(ds_t, 1)


@triton.jit
def dkv_kernel(Q, K, V, C, CLO, SEG, CK, CKLO, SEGK, THR, OFF, DO, LSE, DELTA, DK, DV, DC,
               scale2: tl.constexpr, grad_scale: tl.constexpr, SEQ_Q: tl.constexpr,
               SEQ_K: tl.constexpr, HEADS: tl.constexpr, KV_HEADS: tl.constexpr,
               HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
               WINDOW: tl.constexpr, PRUNE: tl.constexpr, IEEE: tl.constexpr,
               PAIR: tl.constexpr):
  """This query head's dk (times grad_scale), dv (its share of its key/value head's gradient)
  and dc [B, H, SEQ_K] (float32) of one key block."""
  seq, share, kv, vec_q, vec_k, thr, q_off, k_off = _program(THR, OFF, SEQ_Q, SEQ_K, HEADS, KV_HEADS,
                                                             HEAD_DIM, PAIR)
  Q, DO, K, V, DK, DV = Q + seq, DO + seq, K + kv, V + kv, DK + share, DV + share
  CK, CKLO, SEGK = _columns(C, CLO, SEG, CK, CKLO, SEGK, PAIR)
  C, CLO, SEG, LSE, DELTA = C + vec_q, CLO + vec_q, SEG + vec_q, LSE + vec_q, DELTA + vec_q
  CK, CKLO, SEGK, DC = CK + vec_k, CKLO + vec_k, SEGK + vec_k, DC + vec_k
  k_local = tl.program_id(0) * BLOCK_K
  cols = k_local + tl.arange(0, BLOCK_K)
  kv_tile = _rows(k_local, BLOCK_K, KV_HEADS, HEAD_DIM, PAIR)
  k, v, c_k, seg_k = tl.load(K + kv_tile), tl.load(V + kv_tile), tl.load(CK + cols), tl.load(SEGK + cols)
  clo_k = tl.load(CKLO + cols)
  pos_k = k_off + cols
  dk = tl.zeros((BLOCK_K, HEAD_DIM), tl.float32)
  dv = tl.zeros((BLOCK_K, HEAD_DIM), tl.float32)
  dc = tl.zeros((BLOCK_K,), tl.float32)
  first, below, partial, end = _query_blocks(k_off + k_local - q_off, BLOCK_Q, BLOCK_K, SEQ_Q // BLOCK_Q,
                                             WINDOW)
  if PRUNE:
    end = _last_kept_query_block_end(C, tl.min(c_k, 0), thr, below, end, BLOCK_Q)
    partial = tl.minimum(partial, end)
  for qb in range(first, below):  # the diagonal: never pruned
    dk, dv, dc = _dkv_tile(dk, dv, dc, k, v, c_k, clo_k, seg_k, pos_k, Q, DO, C, CLO, SEG, LSE, DELTA,
                           qb * BLOCK_Q, q_off, scale2, BLOCK_Q, HEADS, HEAD_DIM, True, WINDOW, IEEE,
                           PAIR)
  for qb in range(below, partial):
    dk, dv, dc = _dkv_tile(dk, dv, dc, k, v, c_k, clo_k, seg_k, pos_k, Q, DO, C, CLO, SEG, LSE, DELTA,
                           qb * BLOCK_Q, q_off, scale2, BLOCK_Q, HEADS, HEAD_DIM, False, 0, IEEE,
                           PAIR)
  for qb in range(partial, end):
    dk, dv, dc = _dkv_tile(dk, dv, dc, k, v, c_k, clo_k, seg_k, pos_k, Q, DO, C, CLO, SEG, LSE, DELTA,
                           qb * BLOCK_Q, q_off, scale2, BLOCK_Q, HEADS, HEAD_DIM, False, WINDOW, IEEE,
                           PAIR)
  share_tile = _rows(k_local, BLOCK_K, HEADS, HEAD_DIM, PAIR)
  tl.store(DK + share_tile, (dk * grad_scale).to(DK.dtype.element_ty))
  tl.store(DV + share_tile, dv.to(DV.dtype.element_ty))
  tl.store(DC + cols, dc)


@triton.jit
def _dq_tile(dq, delta, q, do, c_q, clo_q, seg_q, pos_q, lse, delta_q, K, V, CK, CKLO, SEGK, k_local, k_off,
             scale2, BLOCK_K: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
             CAUSAL: tl.constexpr, WINDOW: tl.constexpr, ROW_TERM: tl.constexpr,
             IEEE: tl.constexpr, PAIR: tl.constexpr):
  """P and dP of one tile; then dQ += dS K, or (ROW_TERM) only delta += rowsum(P * dP)."""
  s, k, tile = _key_tile(q, c_q, clo_q, seg_q, pos_q, K, CK, CKLO, SEGK, k_local, k_off, scale2, BLOCK_K,
                         KV_HEADS, HEAD_DIM, CAUSAL, WINDOW, IEEE, PAIR)
  p = tl.exp2(s - lse[:, None])
  dp = _dot(do, tl.trans(tl.load(V + tile)), IEEE)
  if ROW_TERM:
    delta += tl.sum(p * dp, 1)
  else:
    dq += _dot((p * (dp - delta_q[:, None])).to(k.dtype), k, IEEE)
  return dq, delta


@triton.jit
def _query_block_sweep(Q, K, V, C, CLO, SEG, CK, CKLO, SEGK, THR, OFF, DO, LSE, DELTA, scale2,
                       SEQ_Q: tl.constexpr, SEQ_K: tl.constexpr, HEADS: tl.constexpr,
                       KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr,
                       BLOCK_K: tl.constexpr, WINDOW: tl.constexpr, PRUNE: tl.constexpr,
                       ROW_TERM: tl.constexpr, IEEE: tl.constexpr, PAIR: tl.constexpr):
  """The key sweep of one query block shared by dq_kernel and row_term_kernel (the same tiles,
  so the recomputed row term matches dQ's P exactly). Returns (dq unscaled, delta, offsets of
  the block's q-shaped tile and of its rows' vectors)."""
  seq, _, kv, vec_q, vec_k, thr, q_off, k_off = _program(THR, OFF, SEQ_Q, SEQ_K, HEADS, KV_HEADS,
                                                         HEAD_DIM, PAIR)
  Q, K, V, DO = Q + seq, K + kv, V + kv, DO + seq
  CK, CKLO, SEGK = _columns(C, CLO, SEG, CK, CKLO, SEGK, PAIR)
  C, CLO, SEG, LSE, DELTA = C + vec_q, CLO + vec_q, SEG + vec_q, LSE + vec_q, DELTA + vec_q
  CK, CKLO, SEGK = CK + vec_k, CKLO + vec_k, SEGK + vec_k
  q_local = tl.program_id(0) * BLOCK_Q
  rows = q_local + tl.arange(0, BLOCK_Q)
  pos_q = q_off + rows
  tile = _rows(q_local, BLOCK_Q, HEADS, HEAD_DIM, PAIR)
  c_q, clo_q = tl.load(C + rows), tl.load(CLO + rows)
  delta_q = tl.zeros((BLOCK_Q,), tl.float32)
  if not ROW_TERM:
    delta_q = tl.load(DELTA + rows)
  q, do = tl.load(Q + tile), tl.load(DO + tile)
  seg_q, lse = tl.load(SEG + rows), tl.load(LSE + rows)
  dq = tl.zeros((BLOCK_Q, HEAD_DIM), tl.float32)
  delta = tl.zeros((BLOCK_Q,), tl.float32)
  first, inside, crossing, end = _kept_key_blocks(CK, c_q, thr, q_off + q_local - k_off, BLOCK_Q,
                                                  BLOCK_K, SEQ_K // BLOCK_K, WINDOW, PRUNE)
  for kb in range(first, inside):
    dq, delta = _dq_tile(dq, delta, q, do, c_q, clo_q, seg_q, pos_q, lse, delta_q, K, V, CK, CKLO, SEGK,
                         kb * BLOCK_K, k_off, scale2, BLOCK_K, KV_HEADS, HEAD_DIM, False, WINDOW, ROW_TERM,
                         IEEE, PAIR)
  for kb in range(inside, crossing):
    dq, delta = _dq_tile(dq, delta, q, do, c_q, clo_q, seg_q, pos_q, lse, delta_q, K, V, CK, CKLO, SEGK,
                         kb * BLOCK_K, k_off, scale2, BLOCK_K, KV_HEADS, HEAD_DIM, False, 0, ROW_TERM,
                         IEEE, PAIR)
  for kb in range(crossing, end):  # the diagonal: never pruned
    dq, delta = _dq_tile(dq, delta, q, do, c_q, clo_q, seg_q, pos_q, lse, delta_q, K, V, CK, CKLO, SEGK,
                         kb * BLOCK_K, k_off, scale2, BLOCK_K, KV_HEADS, HEAD_DIM, True, WINDOW, ROW_TERM,
                         IEEE, PAIR)
  return dq, delta, seq + tile, vec_q + rows


@triton.jit
def dq_kernel(Q, K, V, C, CLO, SEG, CK, CKLO, SEGK, THR, OFF, DO, LSE, DELTA, DQ, scale2: tl.constexpr,
              grad_scale: tl.constexpr, SEQ_Q: tl.constexpr, SEQ_K: tl.constexpr,
              HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
              BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, WINDOW: tl.constexpr,
              PRUNE: tl.constexpr, IEEE: tl.constexpr, PAIR: tl.constexpr):
  """dq (DQ's dtype, times grad_scale) of one query block."""
  dq, _, tile, _ = _query_block_sweep(Q, K, V, C, CLO, SEG, CK, CKLO, SEGK, THR, OFF, DO, LSE, DELTA, scale2,
                                      SEQ_Q, SEQ_K, HEADS, KV_HEADS, HEAD_DIM, BLOCK_Q, BLOCK_K, WINDOW,
                                      PRUNE, False, IEEE, PAIR)
  tl.store(DQ + tile, (dq * grad_scale).to(DQ.dtype.element_ty))


@triton.jit
def row_term_kernel(Q, K, V, C, CLO, SEG, CK, CKLO, SEGK, THR, OFF, DO, LSE, DELTA, scale2: tl.constexpr,
                    SEQ_Q: tl.constexpr, SEQ_K: tl.constexpr, HEADS: tl.constexpr,
                    KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr,
                    BLOCK_K: tl.constexpr, WINDOW: tl.constexpr, PRUNE: tl.constexpr,
                    IEEE: tl.constexpr, PAIR: tl.constexpr):
  """delta [B, H, SEQ_Q] float32 = sum_j P_ij dP_ij of one query block (DELTA is the output)."""
  _, delta, _, positions = _query_block_sweep(
      Q, K, V, C, CLO, SEG, CK, CKLO, SEGK, THR, OFF, DO, LSE, DELTA, scale2, SEQ_Q, SEQ_K, HEADS, KV_HEADS,
      HEAD_DIM, BLOCK_Q, BLOCK_K, WINDOW, PRUNE, True, IEEE, PAIR)
  tl.store(DELTA + positions, delta)

"""Blockwise forgetting attention in plain JAX: O(T) memory on any backend.

FlashAttention-2 style. The forward pass walks query blocks; for each one it streams the key
blocks left of (and on) the causal diagonal with an online softmax in float32, and keeps only
the output and the per-row log-normalizer ``lse``. With a sliding ``window`` each sweep's loop
starts (forward, dq) or ends (dk/dv) at the last block the band reaches, so the tiles wholly
outside it are never computed, in either direction; the tiles it crosses are masked. The
backward pass (the custom_vjp of vjp.py) recomputes each tile's probabilities from ``lse`` in
two sweeps, never holding a [T, T] array:

* with bf16/fp16 inputs, first a query-block sweep for the row term delta_i = sum_j P_ij dP_ij
  (row_term.py says why it is not read off the output there);
* a query-block sweep for dq;
* a key-block sweep for dk, dv and dc_j = -sum_i dS_ij (the column sums of dS). The row sums
  sum_j dS_ij vanish exactly (sum_j P_ij dP_ij = delta_i), so they are not computed.

Then d log_fgate = reverse cumsum of dc, because c_t = sum_{u <= t} log f_u.

The decay bias c_i - c_j is formed per tile from the float32 cumsum, so no large constant is
ever subtracted globally.
"""

import jax.numpy as jnp
from jax import lax

from .block_sizes import (BlockSizes, first_key_block_in_window, heads_major, padded_length,
                          query_block_end_in_window)
from .pruning import unless_skipped
from . import row_term
from .reference import tile_logits
from .vjp import BackendKernels, differentiable


def _tile_logits(q_blk, k_blk, c_q, c_k, seg_q, seg_k, q_start, k_start, sm_scale, window):
  """Logits of one [block_q, block_k] tile, -inf where masked. Shapes [B, H, bq, bk]."""
  qk = jnp.einsum("bhqd,bhkd->bhqk", q_blk, k_blk, preferred_element_type=jnp.float32)
  return tile_logits(qk, c_q, c_k, seg_q, seg_k, sm_scale, q_start, k_start, window=window)


def _slice(x, start, size, axis):
  return lax.dynamic_slice_in_dim(x, start, size, axis=axis)


def _split_blocks(x, block, axis):
  """[..., T, ...] -> [T // block, ..., block, ...] with the block index leading."""
  shape = x.shape[:axis] + (x.shape[axis] // block, block) + x.shape[axis + 1:]
  return jnp.moveaxis(x.reshape(shape), axis, 0)


def _merge_blocks(x, axis):
  """Inverse of _split_blocks."""
  x = jnp.moveaxis(x, 0, axis)
  return x.reshape(x.shape[:axis] + (-1,) + x.shape[axis + 2:])


def _dscores(p, do_blk, v_blk, delta):
  """dS = P * (dP - delta) of one tile, dP = dO V^T (both backward sweeps)."""
  dp = jnp.einsum("bhqd,bhkd->bhqk", do_blk, v_blk, preferred_element_type=jnp.float32)
  return p * (dp - delta[..., None])


def _sweep(tile, c, block, lo, hi, carry, thr, tile_gates):
  """``carry = tile(start, c of the block, carry)`` over blocks [lo, hi) of the side that moves
  (keys in the forward and dq sweeps, queries in the dk/dv sweep). ``tile_gates(c of the
  block)`` gives the tile's (c of its rows, c of its columns), by which pruning skips it."""
  def body(i, carry):
    start = i * block
    c_block = _slice(c, start, block, 2)
    compute = lambda carry: tile(start, c_block, carry)
    return unless_skipped(thr, *tile_gates(c_block), compute, carry)
  return lax.fori_loop(lo, hi, body, carry)


def _forward(q, k, v, c, seg, thr, sm_scale, bq, bk, window):
  """q, k, v: [B, H, T, D]; c, seg: [B, H, T]. Returns o [B, H, T, D], lse [B, H, T]."""
  batch, heads, seq_len, head_dim = q.shape

  def one_query_block(args):
    i, q_blk, c_q, seg_q = args
    q_start = i * bq
    num_k_blocks = (q_start + bq + bk - 1) // bk  # causal: skip blocks right of the diagonal

    def tile(k_start, c_k, carry):
      m, l, acc = carry
      s = _tile_logits(q_blk, _slice(k, k_start, bk, 2), c_q, c_k,
                       seg_q, _slice(seg, k_start, bk, 2), q_start, k_start, sm_scale, window)
      m_new = jnp.maximum(m, s.max(axis=-1))
      m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)  # rows masked so far stay at zero
      p = jnp.exp(s - m_safe[..., None])
      alpha = jnp.exp(m - m_safe)
      l = alpha * l + p.sum(axis=-1)
      pv = jnp.einsum("bhqk,bhkd->bhqd", p.astype(v.dtype), _slice(v, k_start, bk, 2),
                      preferred_element_type=jnp.float32)
      return m_new, l, alpha[..., None] * acc + pv

    init = (jnp.full((batch, heads, bq), -jnp.inf, jnp.float32),
            jnp.zeros((batch, heads, bq), jnp.float32),
            jnp.zeros((batch, heads, bq, head_dim), jnp.float32))
    m, l, acc = _sweep(tile, c, bk, first_key_block_in_window(q_start, bk, window), num_k_blocks,
                       init, thr, lambda c_k: (c_q, c_k))
    # Every real row attends at least to itself, so l >= 1 there.
    return (acc / l[..., None]).astype(q.dtype), m + jnp.log(l)

  blocks = (jnp.arange(seq_len // bq), _split_blocks(q, bq, 2), _split_blocks(c, bq, 2),
            _split_blocks(seg, bq, 2))
  o, lse = lax.map(one_query_block, blocks)
  return _merge_blocks(o, 2), _merge_blocks(lse, 2)


def _row_term(q, k, v, c, seg, thr, do, lse, sm_scale, bq, bk, window):
  """delta_i = sum_j P_ij dP_ij [B, H, T] in float32, over the same tiles as the dq sweep (see
  row_term.py: with bf16/fp16 inputs this replaces rowsum(o * dO))."""
  seq_len = q.shape[2]

  def one_query_block(args):
    i, q_blk, c_q, seg_q, do_blk, lse_blk = args
    q_start = i * bq

    def tile(k_start, c_k, delta):
      s = _tile_logits(q_blk, _slice(k, k_start, bk, 2), c_q, c_k, seg_q,
                       _slice(seg, k_start, bk, 2), q_start, k_start, sm_scale, window)
      p = jnp.exp(s - lse_blk[..., None])
      dp = jnp.einsum("bhqd,bhkd->bhqk", do_blk, _slice(v, k_start, bk, 2),
                      preferred_element_type=jnp.float32)
      return delta + jnp.sum(p * dp, axis=-1)

    num_k_blocks = (q_start + bq + bk - 1) // bk
    return _sweep(tile, c, bk, first_key_block_in_window(q_start, bk, window), num_k_blocks,
                  jnp.zeros(c_q.shape, jnp.float32), thr, lambda c_k: (c_q, c_k))

  blocks = (jnp.arange(seq_len // bq),) + tuple(
      _split_blocks(x, bq, 2) for x in (q, c, seg, do, lse))
  return _merge_blocks(lax.map(one_query_block, blocks), 2)


def _backward_dq(q, k, v, c, seg, thr, do, lse, delta, sm_scale, bq, bk, window):
  seq_len = q.shape[2]

  def one_query_block(args):
    i, q_blk, c_q, seg_q, do_blk, lse_blk, delta_blk = args
    q_start = i * bq

    def tile(k_start, c_k, dq):
      k_blk, v_blk = _slice(k, k_start, bk, 2), _slice(v, k_start, bk, 2)
      s = _tile_logits(q_blk, k_blk, c_q, c_k, seg_q,
                       _slice(seg, k_start, bk, 2), q_start, k_start, sm_scale, window)
      p = jnp.exp(s - lse_blk[..., None])
      ds = _dscores(p, do_blk, v_blk, delta_blk)
      return dq + jnp.einsum("bhqk,bhkd->bhqd", ds.astype(k.dtype), k_blk,
                             preferred_element_type=jnp.float32)

    num_k_blocks = (q_start + bq + bk - 1) // bk
    dq = _sweep(tile, c, bk, first_key_block_in_window(q_start, bk, window), num_k_blocks,
                jnp.zeros(q_blk.shape, jnp.float32), thr, lambda c_k: (c_q, c_k))
    return (dq * sm_scale).astype(q.dtype)

  blocks = (jnp.arange(seq_len // bq),) + tuple(
      _split_blocks(x, bq, 2) for x in (q, c, seg, do, lse, delta))
  return _merge_blocks(lax.map(one_query_block, blocks), 2)


def _backward_dkv(q, k, v, c, seg, thr, do, lse, delta, sm_scale, bq, bk, window):
  seq_len = q.shape[2]

  def one_key_block(args):
    j, k_blk, v_blk, c_k, seg_k = args
    k_start = j * bk

    def tile(q_start, c_q, carry):
      dk, dv, dc = carry
      q_blk, do_blk = _slice(q, q_start, bq, 2), _slice(do, q_start, bq, 2)
      s = _tile_logits(q_blk, k_blk, c_q, c_k,
                       _slice(seg, q_start, bq, 2), seg_k, q_start, k_start, sm_scale, window)
      p = jnp.exp(s - _slice(lse, q_start, bq, 2)[..., None])
      dv = dv + jnp.einsum("bhqk,bhqd->bhkd", p.astype(do.dtype), do_blk,
                           preferred_element_type=jnp.float32)
      ds = _dscores(p, do_blk, v_blk, _slice(delta, q_start, bq, 2))
      dk = dk + jnp.einsum("bhqk,bhqd->bhkd", ds.astype(q.dtype), q_blk,
                           preferred_element_type=jnp.float32)
      return dk, dv, dc - ds.sum(axis=-2)

    first_q_block = k_start // bq  # causal: query blocks above the diagonal see nothing here
    # window: nor do the query blocks below the band
    end_q_block = query_block_end_in_window(k_start, bk, bq, seq_len // bq, window)
    zeros = jnp.zeros(k_blk.shape, jnp.float32)
    dk, dv, dc = _sweep(tile, c, bq, first_q_block, end_q_block,
                        (zeros, zeros, jnp.zeros(c_k.shape, jnp.float32)), thr,
                        lambda c_q: (c_q, c_k))
    return (dk * sm_scale).astype(k.dtype), dv.astype(v.dtype), dc

  blocks = (jnp.arange(seq_len // bk), _split_blocks(k, bk, 2), _split_blocks(v, bk, 2),
            _split_blocks(c, bk, 2), _split_blocks(seg, bk, 2))
  dk, dv, dc = lax.map(one_key_block, blocks)
  return _merge_blocks(dk, 2), _merge_blocks(dv, 2), _merge_blocks(dc, 2)


def _backward(*args):
  return (_backward_dq(*args), *_backward_dkv(*args))


# static = (sm_scale, bq, bk, window)
_blockwise = differentiable(BackendKernels(
    cumsum=lambda log_fgate: jnp.cumsum(log_fgate, axis=-1), forward=_forward, row_term=_row_term,
    row_term_from_output=row_term.from_output, backward=_backward, seq_axis=2))


def xla_attention(q, k, v, log_fgate, segment_ids, sm_scale, block_sizes=None, interpret=False,
                  prune_threshold=None, window=None):
  """Blockwise backend. Layouts as in ``forgetting_attention``; pads T up to the block size.

  Uses ``block_q``/``block_k`` of ``block_sizes`` for every sweep (default 128).
  ``prune_threshold`` [batch, heads] (or None) enables tile skipping (see pruning.py).
  ``window``: None or a static int, sliding-window attention (tiles outside the band skipped).
  """
  del interpret  # plain JAX: nothing to interpret
  seq_len = q.shape[1]
  sizes = (block_sizes or BlockSizes()).fitted(seq_len)
  bq, bk = sizes.block_q, sizes.block_k
  padded_len = padded_length(seq_len, max(bq, bk))
  # Padded keys lie right of every real query, so the causal mask already hides them.
  o = _blockwise(*(heads_major(x, padded_len) for x in (q, k, v, log_fgate, segment_ids)),
                 prune_threshold, (float(sm_scale), bq, bk, window))
  return jnp.swapaxes(o, 1, 2)[:, :seq_len]

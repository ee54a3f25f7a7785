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

c is the two-float cumsum of decay.py (each (batch, head, position) holds c = hi + lo), and
every tile forms c_i - c_j from the two parts, never as a difference of two large float32
numbers; the backward's reverse cumsum of dc is compensated the same way.

Grouped-query attention (gqa.py): k, v (and dk, dv) hold H key/value heads, q, dO, c, the
segment ids, lse, delta and dc all HQ query heads. Every tile product views the query side as
[B, H, G, ...] against the shared [B, H, ...] key/value head (no repeat), and the dk/dv sweep's
products contract over the group's query heads and the block's rows together: dK and dV are
summed over the group inside the sweep, in its float32 accumulators of K's size (no
per-query-head copy).

Block pairs. Every sweep is written for a block of queries and a block of keys that may be two
different stretches of one sequence: the queries' arrays (q, c_q, seg_q, and dO, lse, delta)
and the keys' (k, v, c_k, seg_k) come separately, with ``offsets`` = (q_offset, k_offset), the
global positions of their first elements (traced ints are fine). The causal and window loop
bounds are taken from the global positions, so a pair whose keys all lie after its queries
costs no tile. Single-device attention is the pair of the sequence with itself at offsets
(0, 0); the context-parallel ring (context_parallel.py) calls the ``pair_*`` functions with the
shards it holds and receives. For a pair, a row that sees no key gets o = 0 and lse = -inf,
which the ring's merge and backward treat as "no contribution".
"""

import jax.numpy as jnp
from jax import lax

from . import decay
from .backends import Backend, PairKernels, register_backend

from .block_sizes import BlockSizes, heads_major, key_block_ranges, padded_length, query_block_ranges
from .gqa import grouped, ungrouped
from .pruning import unless_skipped
from . import row_term
from .reference import tile_logits
from .vjp import BackendKernels, differentiable


def _rows_by_keys(rows, keys):
  """rows [B, HQ, r, D] . keys [B, H, k, D] -> [B, HQ, r, k] float32: each query head against
  its group's key/value head (q k^T, and dO v^T)."""
  out = jnp.einsum("bhgqd,bhkd->bhgqk", grouped(rows, keys.shape[1], 1), keys,
                   preferred_element_type=jnp.float32)
  return ungrouped(out, 1)


def _weights_by_keys(p, keys):
  """p [B, HQ, r, k] @ keys [B, H, k, D] -> [B, HQ, r, D] float32 (P V, and dS K)."""
  out = jnp.einsum("bhgqk,bhkd->bhgqd", grouped(p, keys.shape[1], 1), keys,
                   preferred_element_type=jnp.float32)
  return ungrouped(out, 1)


def _group_keys_grad(p, rows, kv_heads):
  """p^T rows summed over the group: p [B, HQ, r, k], rows [B, HQ, r, D] -> [B, H, k, D]
  float32 (dV = P^T dO and dK = dS^T Q of the shared key/value head)."""
  return jnp.einsum("bhgqk,bhgqd->bhkd", grouped(p, kv_heads, 1), grouped(rows, kv_heads, 1),
                    preferred_element_type=jnp.float32)


def _tile_logits(q_blk, k_blk, c_q, c_k, seg_q, seg_k, q_start, k_start, sm_scale, window):
  """Logits of one [block_q, block_k] tile, -inf where masked. Shapes [B, HQ, bq, bk]."""
  qk = _rows_by_keys(q_blk, k_blk)
  return tile_logits(qk, c_q, c_k, seg_q, seg_k, sm_scale, q_start, k_start, window=window)


def _slice(x, start, size, axis):
  """A slice of an array or of both parts of a TwoFloat c."""
  return decay.tree_map(lambda x: lax.dynamic_slice_in_dim(x, start, size, axis=axis), x)


def _split_blocks(x, block, axis):
  """[..., T, ...] -> [T // block, ..., block, ...] with the block index leading (both parts of
  a TwoFloat c)."""
  def split(x):
    shape = x.shape[:axis] + (x.shape[axis] // block, block) + x.shape[axis + 1:]
    return jnp.moveaxis(x.reshape(shape), axis, 0)
  return decay.tree_map(split, x)


def _merge_blocks(x, axis):
  """Inverse of _split_blocks."""
  x = jnp.moveaxis(x, 0, axis)
  return x.reshape(x.shape[:axis] + (-1,) + x.shape[axis + 2:])


def _dscores(p, do_blk, v_blk, delta):
  """dS = P * (dP - delta) of one tile, dP = dO V^T (both backward sweeps)."""
  dp = _rows_by_keys(do_blk, v_blk)
  return p * (dp - delta[..., None])


def _probabilities(s, lse):
  """exp(s - lse) of a tile; a row with lse = -inf (it sees no key of this pair) gets zeros."""
  return jnp.exp(s - jnp.where(jnp.isneginf(lse), jnp.inf, lse)[..., None])


def _key_blocks(q_start, bq, bk, num_k_blocks, window, k_offset):
  """[lo, hi) of the key blocks that the query block whose first row sits at global position
  ``q_start`` can see: causal (no key after its last row) and, with a window, none wholly
  before the band (block_sizes.key_block_ranges; this sweep masks every tile it visits)."""
  first, _, _, end = key_block_ranges(q_start - k_offset, bq, bk, num_k_blocks, window)
  return first, end


def _query_blocks(k_start, bk, bq, num_q_blocks, window, q_offset):
  """[lo, hi) of the query blocks that see the key block whose first key sits at global
  position ``k_start``: none wholly before it (causal) and, with a window, none wholly past
  the band (block_sizes.query_block_ranges)."""
  first, _, _, end = query_block_ranges(k_start - q_offset, bq, bk, num_q_blocks, window)
  return first, end


def _sweep(tile, c, block, lo, hi, carry, thr, tile_gates):
  """``carry = tile(start, c of the block, carry)`` over blocks [lo, hi) of the side that moves
  (keys in the forward and dq sweeps, queries in the dk/dv sweep); ``start`` is the block's
  local index times ``block``. ``tile_gates(c of the block)`` gives the tile's (c of its rows,
  c of its columns), by which pruning skips it."""
  def body(i, carry):
    start = i * block
    c_block = _slice(c, start, block, 2)
    compute = lambda carry: tile(start, c_block, carry)
    return unless_skipped(thr, *tile_gates(c_block), compute, carry)
  return lax.fori_loop(lo, hi, body, carry)


def _query_block_sweep(tile, q_side, k, c_k, thr, offsets, bq, bk, window, init):
  """For every query block: ``tile(i_start, q_blocks, k_start, c_k_block, carry)`` over the key
  blocks it sees, from ``init(q_blocks)``. ``q_side``: the queries' [B, H, T, ...] arrays, split
  into blocks; returns the stacked per-block results merged back along T."""
  q_offset, k_offset = offsets
  num_k_blocks = k.shape[2] // bk

  def one_query_block(args):
    i, *blocks = args
    q_start = q_offset + i * bq
    lo, hi = _key_blocks(q_start, bq, bk, num_k_blocks, window, k_offset)
    c_q = blocks[1]
    step = lambda start, c_blk, carry: tile(q_start, blocks, k_offset + start, start, c_blk, carry)
    return _sweep(step, c_k, bk, lo, hi, init(blocks), thr, lambda c_blk: (c_q, c_blk))

  seq_len = q_side[0].shape[2]
  stacked = (jnp.arange(seq_len // bq),) + tuple(_split_blocks(x, bq, 2) for x in q_side)
  out = lax.map(one_query_block, stacked)
  return out


def pair_forward(q, k, v, c_q, c_k, seg_q, seg_k, thr, offsets, sm_scale, sizes, window, interpret=False):
  """q: [B, HQ, Tq, D], k, v: [B, H, Tk, D] (H divides HQ: gqa.py); c_*, seg_*: [B, HQ, T*]
  (c_* a decay.TwoFloat, or plain float32 arrays). Returns o [B, HQ, Tq, D] (float32) and lse
  [B, HQ, Tq]. ``sizes``: a fitted BlockSizes, of which these sweeps use block_q, block_k;
  ``interpret`` is the ring's for the Pallas kernels (plain JAX has nothing to interpret)."""
  del interpret
  batch, heads, _, head_dim = q.shape
  bq, bk = sizes.block_q, sizes.block_k

  def tile(q_start, blocks, k_start, local, c_blk, carry):
    q_blk, c_blk_q, seg_blk_q = blocks
    m, l, acc = carry
    s = _tile_logits(q_blk, _slice(k, local, bk, 2), c_blk_q, c_blk, seg_blk_q,
                     _slice(seg_k, local, bk, 2), q_start, k_start, sm_scale, window)
    m_new = jnp.maximum(m, s.max(axis=-1))
    m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)  # rows masked so far stay at zero
    p = jnp.exp(s - m_safe[..., None])
    alpha = jnp.exp(m - m_safe)
    l = alpha * l + p.sum(axis=-1)
    pv = _weights_by_keys(p.astype(v.dtype), _slice(v, local, bk, 2))
    return m_new, l, alpha[..., None] * acc + pv

  init = lambda blocks: (jnp.full((batch, heads, bq), -jnp.inf, jnp.float32),
                         jnp.zeros((batch, heads, bq), jnp.float32),
                         jnp.zeros((batch, heads, bq, head_dim), jnp.float32))
  m, l, acc = _query_block_sweep(tile, (q, c_q, seg_q), k, c_k, thr, offsets, bq, bk, window, init)
  seen = l > 0  # in self-attention every row sees itself; in a pair a row may see nothing
  o = acc / jnp.where(seen, l, 1.0)[..., None]
  lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), -jnp.inf)
  return _merge_blocks(o, 2), _merge_blocks(lse, 2)


def pair_row_term(q, k, v, c_q, c_k, seg_q, seg_k, thr, offsets, do, lse, sm_scale, sizes, window,
                  interpret=False):
  """This pair's part of delta_i = sum_j P_ij dP_ij [B, H, Tq] in float32, over the same tiles
  as the dq sweep (see row_term.py: with bf16/fp16 inputs this replaces rowsum(o * dO)); ``lse``
  is the row's log-normalizer over all keys."""
  del interpret
  bq, bk = sizes.block_q, sizes.block_k

  def tile(q_start, blocks, k_start, local, c_blk, delta):
    q_blk, c_blk_q, seg_blk_q, do_blk, lse_blk = blocks
    s = _tile_logits(q_blk, _slice(k, local, bk, 2), c_blk_q, c_blk, seg_blk_q,
                     _slice(seg_k, local, bk, 2), q_start, k_start, sm_scale, window)
    dp = _rows_by_keys(do_blk, _slice(v, local, bk, 2))
    return delta + jnp.sum(_probabilities(s, lse_blk) * dp, axis=-1)

  init = lambda blocks: jnp.zeros(blocks[0].shape[:-1], jnp.float32)
  delta = _query_block_sweep(tile, (q, c_q, seg_q, do, lse), k, c_k, thr, offsets, bq, bk, window, init)
  return _merge_blocks(delta, 2)


def pair_backward_dq(q, k, v, c_q, c_k, seg_q, seg_k, thr, offsets, do, lse, delta, sm_scale, sizes,
                     window, interpret=False):
  """This pair's part of dq [B, H, Tq, D], float32 (not yet times sm_scale)."""
  del interpret
  bq, bk = sizes.block_q, sizes.block_k

  def tile(q_start, blocks, k_start, local, c_blk, dq):
    q_blk, c_blk_q, seg_blk_q, do_blk, lse_blk, delta_blk = blocks
    k_blk, v_blk = _slice(k, local, bk, 2), _slice(v, local, bk, 2)
    s = _tile_logits(q_blk, k_blk, c_blk_q, c_blk, seg_blk_q, _slice(seg_k, local, bk, 2), q_start,
                     k_start, sm_scale, window)
    ds = _dscores(_probabilities(s, lse_blk), do_blk, v_blk, delta_blk)
    return dq + _weights_by_keys(ds.astype(k.dtype), k_blk)

  init = lambda blocks: jnp.zeros(blocks[0].shape, jnp.float32)
  dq = _query_block_sweep(tile, (q, c_q, seg_q, do, lse, delta), k, c_k, thr, offsets, bq, bk, window, init)
  return _merge_blocks(dq, 2)


def pair_backward_dkv(q, k, v, c_q, c_k, seg_q, seg_k, thr, offsets, do, lse, delta, sm_scale, sizes,
                      window, interpret=False):
  """This pair's part of (dk (not yet times sm_scale), dv, dc_k), all float32; dk, dv [B, H,
  Tk, D] summed over each group's query heads, dc_k [B, HQ, Tk]."""
  del interpret
  bq, bk = sizes.block_q, sizes.block_k
  q_offset, k_offset = offsets
  kv_heads = k.shape[1]
  num_q_blocks = q.shape[2] // bq

  def one_key_block(args):
    j, k_blk, v_blk, c_blk_k, seg_blk_k = args
    k_start = k_offset + j * bk

    def tile(local, c_blk_q, carry):
      dk, dv, dc = carry
      q_blk, do_blk = _slice(q, local, bq, 2), _slice(do, local, bq, 2)
      s = _tile_logits(q_blk, k_blk, c_blk_q, c_blk_k, _slice(seg_q, local, bq, 2), seg_blk_k,
                       q_offset + local, k_start, sm_scale, window)
      p = _probabilities(s, _slice(lse, local, bq, 2))
      dv = dv + _group_keys_grad(p.astype(do.dtype), do_blk, kv_heads)
      ds = _dscores(p, do_blk, v_blk, _slice(delta, local, bq, 2))
      dk = dk + _group_keys_grad(ds.astype(q.dtype), q_blk, kv_heads)
      return dk, dv, dc - ds.sum(axis=-2)

    lo, hi = _query_blocks(k_start, bk, bq, num_q_blocks, window, q_offset)
    zeros = jnp.zeros(k_blk.shape, jnp.float32)
    return _sweep(tile, c_q, bq, lo, hi, (zeros, zeros, jnp.zeros(seg_blk_k.shape, jnp.float32)), thr,
                  lambda c_blk_q: (c_blk_q, c_blk_k))

  blocks = (jnp.arange(k.shape[2] // bk),) + tuple(_split_blocks(x, bk, 2) for x in (k, v, c_k, seg_k))
  dk, dv, dc = lax.map(one_key_block, blocks)
  return _merge_blocks(dk, 2), _merge_blocks(dv, 2), _merge_blocks(dc, 2)


# Self-attention: the sequence paired with itself, in the layout of vjp.BackendKernels.

def _forward(q, k, v, c, seg, thr, sm_scale, sizes, window):
  o, lse = pair_forward(q, k, v, c, c, seg, seg, thr, (0, 0), sm_scale, sizes, window)
  return o.astype(q.dtype), lse


def _row_term(q, k, v, c, seg, thr, do, lse, *static):
  return pair_row_term(q, k, v, c, c, seg, seg, thr, (0, 0), do, lse, *static)


def _backward(q, k, v, c, seg, thr, do, lse, delta, sm_scale, sizes, window):
  args = (q, k, v, c, c, seg, seg, thr, (0, 0), do, lse, delta, sm_scale, sizes, window)
  dq = pair_backward_dq(*args)
  dk, dv, dc = pair_backward_dkv(*args)
  return ((dq * sm_scale).astype(q.dtype), (dk * sm_scale).astype(k.dtype), dv.astype(v.dtype), dc)


# static = (sm_scale, sizes, window)
_blockwise = differentiable(BackendKernels(
    cumsum=lambda log_fgate: decay.cumsum(log_fgate, axis=-1), forward=_forward, row_term=_row_term,
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
  sizes = fit_block_sizes(block_sizes, seq_len)
  padded_len = padded_length(seq_len, sizes.largest)
  # Padded keys lie right of every real query, so the causal mask already hides them.
  o = _blockwise(*(heads_major(x, padded_len) for x in (q, k, v, log_fgate, segment_ids)),
                 prune_threshold, (float(sm_scale), sizes, window))
  return jnp.swapaxes(o, 1, 2)[:, :seq_len]


def fit_block_sizes(block_sizes, seq_len, head_dim=None, dtype=None):
  """``block_sizes`` (default 128 x 128) fitted to seq_len; every sweep runs block_q x block_k
  (the backward sizes are set to them, so the padding is a multiple of those two only)."""
  del head_dim, dtype  # any
  sizes = block_sizes or BlockSizes()
  return BlockSizes(sizes.block_q, sizes.block_k).fitted(seq_len)


# Any platform, any head dim: the last fallback of "auto", and the context-parallel ring's pairs.
register_backend(Backend("xla", xla_attention, priority=0,
                         pair_kernels=PairKernels(pair_forward, pair_row_term, pair_backward_dq, pair_backward_dkv,
                                                  fit_block_sizes)))

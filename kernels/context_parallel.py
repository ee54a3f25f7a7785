"""Context parallelism: forgetting attention with the sequence sharded over a mesh axis (a ring).

``ring_attention`` runs inside ``shard_map`` on one device's stretch of the sequence, L = T / N
tokens of N; ``sharded_forgetting_attention(..., context_axis=...)`` is the global entry point.
Forgetting attention splits across shards because its decay is a difference of one cumulative
sum, c_t = sum_{u <= t} log f_u:

* c: each device takes the cumulative sum of its own log f and adds the sum of all earlier
  shards' totals (one all-gather of a [batch, heads] total per device), all of it in decay.py's
  two float32 parts (c = hi + lo), so the global c stays exact at any length. Only the keys' c
  travels with K and V; the logits c_i - c_j are formed per tile from the two parts, exactly
  as the single-device kernels do. Segment ids are renumbered the same way (a cumulative
  count of segment starts plus the earlier shards' counts; a shard's first token compares its
  id with the previous shard's last, one ppermute), so packed documents and hard cuts cross
  shard boundaries correctly.
* The ring: K, V, c and the segment ids of every shard visit every device (``ppermute`` one
  step around the context axis, sent before the step's compute so that XLA may overlap the two);
  each device attends from its queries to the visiting keys with the pair kernels of the
  backend (``Backend.pair_kernels``: the blockwise kernels of xla_blockwise.py, or the Pallas
  and Triton GPU kernels through gpu_calls.py), whose loop bounds follow the global positions
  (a pair of blocks that causality or the window rules out costs no tile), and merges the
  partial results by their log-normalizers.
* Load balance. Causal attention gives the device with the last shard N times the work of the
  first. Without a window the sequence is therefore cut into 2N chunks and device d holds chunks
  d and 2N - 1 - d (one from the front, one from the back), so every ring step costs every
  device the same two chunk pairs. The model keeps the natural order (RoPE, KV-shift and the
  loss see contiguous shards); the attention moves each shard's halves to their balanced
  places and the output back (two ppermutes each way). With a window the natural layout is
  already balanced, and the ring visits only the ceil((w - 1) / L) previous shards that the
  band reaches.
* Backward (custom_vjp): a second ring in which dK, dV and dc of the visiting keys travel with
  them and return home at the end; dq stays local. The row term delta_i is read off the output
  for float32 inputs and recomputed over one more ring pass for bf16/fp16 (row_term.py says
  why). d log f then comes from autodiff of the cumulative sum above: a reverse cumsum within
  the shard (compensated, decay.py) plus the later shards' totals.
* Pruning (``prune_epsilon``): the bound of pruning.py over the whole sequence (the norms'
  max over the shards), so the shards skip what one device would; a chunk padded up to the
  tile size pads c with its last value, so padding never stops a skip.

Grouped-query attention (gqa.py): k, v carry H key/value heads, q and the gate HQ; what travels
around the ring is K and V at H heads (the keys' c and segment ids stay per query head: no
head_dim), and so are dK and dV on the way back, already summed over each group by the pair
kernels (xla_blockwise.py; the GPU kernels' glue, gpu_calls.py). The ring's traffic in K, V,
dK, dV therefore scales with H.

Which kernels run the block pairs: ``impl`` names a backend with pair kernels ("xla",
"pallas", "triton"), or "auto" picks the first of the table that runs natively here, as on
one device (backends.py): the Pallas GPU kernel on a GPU, the blockwise XLA kernels elsewhere
(the TPU kernel has no pair kernels yet). The backend fits its own tiles to a chunk
(``PairKernels.block_sizes``: the GPU kernels' are at least 16), and each chunk is padded to
a multiple of the largest. Communication per layer, forward: N - 1 steps of K, V (and c, ids);
backward: N - 1 steps of K, V, dK, dV (and c, ids, dc); bf16 adds one K, V ring for the row term.
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from . import decay, row_term
from .backends import resolve
from .block_sizes import heads_major, padded_length
from .pruning import skip_threshold
from .checks import check_shapes, check_window
from .segments import segment_starts

# Padding of a chunk up to the tile size: padded rows and columns get ids that match nothing
# (real ids are >= 0), so a padded key is never seen, even by a later chunk's queries. Their c
# is the chunk's last c ("edge"): c never increases, so a padded row raises no block's max c
# and a padded column lowers no block's min c, and pruning skips what it would skip without
# the padding (a 0 there made every padded query block look undecayed).
_PAD_ROW_ID, _PAD_COL_ID = -2, -1


def ring_attention(q, k, v, log_fgate, segment_ids=None, *, axis_name, axis_size, sm_scale=None,
                   impl="auto", block_sizes=None, interpret=False, debug=False, prune_epsilon=None,
                   window=None):
  """``forgetting_attention`` of the whole sequence, called inside ``shard_map`` on this
  device's shard: q [batch, L, heads, head_dim], k, v [batch, L, kv_heads, head_dim] (kv_heads
  dividing heads: grouped-query attention), log_fgate [batch, L, heads] and
  segment_ids [batch, L] are positions [d L, (d + 1) L) of the sequence, d the index along
  ``axis_name`` (``axis_size`` devices). Returns this shard's output, [batch, L, heads, head_dim].
  The other keywords are ``forgetting_attention``'s; ``impl`` must name a backend with pair
  kernels (``Backend.pair_kernels``), or be "auto" (the first such backend of the table that
  runs natively here: the GPU kernel on a GPU). ``interpret`` goes to the pair kernels (Pallas
  interpret mode on CPU)."""
  del debug  # value checks run on the global arrays (sharded.py)
  group = check_shapes(q, k, v, log_fgate, segment_ids)
  n, local_len = axis_size, q.shape[1]
  window = check_window(window, n * local_len)
  pairs = resolve(impl, q.shape[-1], q.dtype, window, context_parallel=True, kv_group=group).pair_kernels
  layout = _Balanced(n, axis_name) if window is None else _Contiguous(n, axis_name)
  if local_len % layout.chunks:
    raise ValueError(f"forgetting_attention: context parallelism over {n} devices needs the sequence "
                     f"length to be a multiple of {n * layout.chunks}, got {n * local_len}")
  sm_scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
  if prune_epsilon is not None and not 0 < prune_epsilon < 1:
    raise ValueError(f"forgetting_attention: prune_epsilon must be in (0, 1), got {prune_epsilon}")

  log_fgate, ids = _global_segments(log_fgate, segment_ids, axis_name, n)
  local = decay.cumsum(log_fgate, axis=1)
  earlier = _earlier_shards_decay(decay.tree_map(lambda x: x[:, -1], local), axis_name)
  c = decay.add(local, decay.tree_map(lambda x: x[:, None], earlier))
  threshold = None
  if prune_epsilon is not None:
    # constant in q and k (it only picks tiles); stopped first, as pmax has no derivative
    threshold = skip_threshold(lax.stop_gradient(q), lax.stop_gradient(k), sm_scale, prune_epsilon, axis_name)

  chunk_len = local_len // layout.chunks
  sizes = pairs.block_sizes(block_sizes, chunk_len, q.shape[-1], q.dtype)
  padded = padded_length(chunk_len, sizes.largest)
  padded_parts = lambda parts, fill=0: [heads_major(part, padded, fill) for part in parts]
  chunked = lambda x, fill=0: padded_parts(layout.split(x), fill)
  c_parts = [decay.TwoFloat(*parts) for parts in zip(chunked(c.hi, "edge"), chunked(c.lo, "edge"))]
  id_parts = layout.split(ids)  # moved once, padded two ways
  steps = context_steps(window, n * local_len, n)
  static = (axis_name, n, steps, float(sm_scale), sizes, window, bool(interpret), pairs)
  o = _ring(chunked(q), chunked(k), chunked(v), c_parts, padded_parts(id_parts, _PAD_ROW_ID),
            padded_parts(id_parts, _PAD_COL_ID), layout.offsets(chunk_len), threshold, static)
  return layout.merge([jnp.swapaxes(part[:, :, :chunk_len], 1, 2) for part in o])


def _earlier_shards(total, axis_name):
  """The sum of ``total`` over the shards before this one (an exclusive prefix along the axis)."""
  everyone = lax.all_gather(total, axis_name)  # [N, ...]
  prefix = jnp.cumsum(everyone, axis=0) - everyone
  return lax.dynamic_index_in_dim(prefix, lax.axis_index(axis_name), keepdims=False)


def _earlier_shards_decay(total, axis_name):
  """``_earlier_shards`` of a two-float total (decay.TwoFloat [batch, heads]), summed exactly."""
  everyone = decay.tree_map(lambda x: lax.all_gather(x, axis_name), total)  # [N, ...]
  inclusive = decay.two_float_cumsum(everyone, axis=0)
  d = lax.axis_index(axis_name)
  before = lambda x: jnp.where(d > 0, lax.dynamic_index_in_dim(x, jnp.maximum(d - 1, 0), keepdims=False), 0.0)
  return decay.tree_map(before, inclusive)


def _global_segments(log_fgate, segment_ids, axis_name, n):
  """(finite log f, int32 ids [batch, L, heads]) as ``api.prepare_segments`` gives for the whole
  sequence: a hard cut or a change of id starts a segment, ids count the starts so far."""
  is_cut = jnp.isneginf(log_fgate)
  starts = is_cut
  if segment_ids is not None:
    # the previous shard's last id (device 0 receives zeros and has no predecessor)
    previous = lax.ppermute(segment_ids[:, -1], axis_name, [(i, i + 1) for i in range(n - 1)])
    first = (lax.axis_index(axis_name) > 0) & (segment_ids[:, 0] != previous)
    starts = starts | segment_starts(segment_ids).at[:, 0].set(first)[:, :, None]
  counts = starts.astype(jnp.int32)
  ids = jnp.cumsum(counts, axis=1) + _earlier_shards(jnp.sum(counts, axis=1), axis_name)[:, None]
  return jnp.where(is_cut, 0.0, log_fgate), ids


class _Contiguous:
  """Device d holds positions [d L, (d + 1) L): the natural layout, one chunk."""

  chunks = 1

  def __init__(self, n, axis_name):
    del n  # the same signature as _Balanced
    self.axis_name = axis_name

  def split(self, x):
    return [x]

  def merge(self, parts):
    return parts[0]

  def offsets(self, chunk_len):
    return [lax.axis_index(self.axis_name) * chunk_len]


class _Balanced:
  """The sequence in 2N chunks, device d holding chunks d and 2N - 1 - d. In the natural layout
  device d holds chunks 2d and 2d + 1; chunk g belongs at device g (slot 0) if g < N, else at
  device 2N - 1 - g (slot 1). Each of the two halves moves by one ppermute; a device's slot-0
  chunk arrives through the ppermute of its own parity."""

  chunks = 2

  def __init__(self, n, axis_name):
    self.n, self.axis_name = n, axis_name
    home = lambda g: g if g < n else 2 * n - 1 - g
    self.perms = [[(d, home(2 * d + half)) for d in range(n)] for half in (0, 1)]

  def _even(self):
    return lax.axis_index(self.axis_name) % 2 == 0

  def split(self, x):
    halves = jnp.split(x, 2, axis=1)
    got = [lax.ppermute(half, self.axis_name, perm) for half, perm in zip(halves, self.perms)]
    even = self._even()
    return [jnp.where(even, got[0], got[1]), jnp.where(even, got[1], got[0])]

  def merge(self, parts):
    even = self._even()
    by_half = [jnp.where(even, parts[0], parts[1]), jnp.where(even, parts[1], parts[0])]
    back = [lax.ppermute(part, self.axis_name, [(b, a) for a, b in perm])
            for part, perm in zip(by_half, self.perms)]
    return jnp.concatenate(back, axis=1)

  def offsets(self, chunk_len):
    d = lax.axis_index(self.axis_name)
    return [d * chunk_len, (2 * self.n - 1 - d) * chunk_len]


def _shift(tree, axis_name, n, by=1):
  """Every leaf of ``tree`` moved ``by`` devices along the ring."""
  perm = [(i, (i + by) % n) for i in range(n)]
  return jax.tree.map(lambda x: lax.ppermute(x, axis_name, perm), tree)


def _merge(o, lse, o_new, lse_new):
  """Two normalized partial outputs of the same rows (over disjoint keys) as one."""
  top = jnp.maximum(lse, lse_new)
  top = jnp.where(jnp.isfinite(top), top, 0.0)
  a, b = jnp.exp(lse - top), jnp.exp(lse_new - top)
  total = a + b
  seen = total > 0
  o = (o * a[..., None] + o_new * b[..., None]) / jnp.where(seen, total, 1.0)[..., None]
  return o, jnp.where(seen, top + jnp.log(jnp.where(seen, total, 1.0)), -jnp.inf)


def _pairs(queries, keys):
  """Every (query chunk a, key chunk b) index pair of a ring step."""
  return [(a, b) for a in range(len(queries)) for b in range(len(keys))]


def _ring_scan(step, carry, visiting, static, home=None):
  """``carry, visiting = step(carry, visiting)`` for each of the ring's steps, ``visiting`` sent
  on to the next device between steps (the first step uses this device's own keys). With
  ``home``, the leaves ``home(visiting)`` picks are sent back to the device they came from after
  the last step, and returned too."""
  axis_name, n, steps = static[:3]

  def body(state, _):
    carry, visiting = state
    if home is None:  # nothing computed rides along: send first, so that XLA may overlap
      incoming = _shift(visiting, axis_name, n)
      carry, _ = step(carry, visiting)
    else:
      carry, visiting = step(carry, visiting)
      incoming = _shift(visiting, axis_name, n)
    return (carry, incoming), None

  (carry, visiting), _ = lax.scan(body, (carry, visiting), None, length=steps - 1)
  carry, visiting = step(carry, visiting)
  if home is None:
    return carry
  return carry, _shift(home(visiting), axis_name, n, by=-(steps - 1))


def _forward_ring(q, k, v, c, seg_q, seg_k, offsets, thr, static):
  *options, pairs = static[3:]  # options: sm_scale, sizes, window, interpret
  keys = (k, v, c, seg_k, offsets)

  def step(carry, visiting):
    o, lse = list(carry[0]), list(carry[1])
    k_in, v_in, c_in, seg_in, off_in = visiting
    for a, b in _pairs(q, k_in):
      part = pairs.forward(q[a], k_in[b], v_in[b], c[a], c_in[b], seg_q[a], seg_in[b], thr,
                           (offsets[a], off_in[b]), *options)
      o[a], lse[a] = _merge(o[a], lse[a], *part)
    return (o, lse), visiting

  o0 = [jnp.zeros(x.shape, jnp.float32) for x in q]
  lse0 = [jnp.full(x.hi.shape, -jnp.inf, jnp.float32) for x in c]
  return _ring_scan(step, (o0, lse0), keys, static)


@functools.partial(jax.custom_vjp, nondiff_argnums=(8,))
def _ring(q, k, v, c, seg_q, seg_k, offsets, thr, static):
  """Lists of chunks [batch, heads, padded, ...] -> this device's outputs, one per chunk."""
  o, _ = _forward_ring(q, k, v, c, seg_q, seg_k, offsets, thr, static)
  return [x.astype(q[0].dtype) for x in o]


def _ring_fwd(q, k, v, c, seg_q, seg_k, offsets, thr, static):
  o, lse = _forward_ring(q, k, v, c, seg_q, seg_k, offsets, thr, static)
  kept = None if row_term.recomputes(q[0].dtype) else o
  return [x.astype(q[0].dtype) for x in o], (q, k, v, c, seg_q, seg_k, offsets, thr, kept, lse)


def _ring_bwd(static, residuals, do):
  q, k, v, c, seg_q, seg_k, offsets, thr, o, lse = residuals
  *options, pairs = static[3:]
  sm_scale = options[0]
  do = [x.astype(q[0].dtype) for x in do]
  rows = lambda a: (q[a], c[a], seg_q[a])

  def pair_args(a, b, visiting):
    k_in, v_in, c_in, seg_in, off_in = visiting[:5]
    q_a, c_a, seg_a = rows(a)
    return (q_a, k_in[b], v_in[b], c_a, c_in[b], seg_a, seg_in[b], thr, (offsets[a], off_in[b]))

  keys = (k, v, c, seg_k, offsets)
  if o is None:  # bf16/fp16: delta summed over every visiting key chunk (row_term.py)
    def row_step(delta, visiting):
      delta = list(delta)
      for a, b in _pairs(q, visiting[0]):
        delta[a] = delta[a] + pairs.row_term(*pair_args(a, b, visiting), do[a], lse[a], *options)
      return delta, visiting
    delta = _ring_scan(row_step, [jnp.zeros(x.hi.shape, jnp.float32) for x in c], keys, static)
  else:
    delta = [row_term.from_output(x, g) for x, g in zip(o, do)]

  def grad_step(dq, visiting):
    dq, (dk, dv, dc) = list(dq), [list(x) for x in visiting[5:]]
    for a, b in _pairs(q, visiting[0]):
      args = pair_args(a, b, visiting) + (do[a], lse[a], delta[a], *options)
      dq[a] = dq[a] + pairs.backward_dq(*args)
      ddk, ddv, ddc = pairs.backward_dkv(*args)
      dk[b], dv[b], dc[b] = dk[b] + ddk, dv[b] + ddv, dc[b] + ddc
    return dq, visiting[:5] + (dk, dv, dc)

  zeros = lambda xs: [jnp.zeros(x.shape, jnp.float32) for x in xs]
  dq, (dk, dv, dc) = _ring_scan(grad_step, zeros(q), keys + (zeros(k), zeros(v), zeros(seg_k)), static,
                                home=lambda visiting: visiting[5:])
  cast = lambda xs, like, scale=1.0: [(x * scale).astype(y.dtype) for x, y in zip(xs, like)]
  # c's low parts carry no derivative (decay.py)
  dc = [decay.TwoFloat(x, jnp.zeros_like(x)) for x in dc]
  return (cast(dq, q, sm_scale), cast(dk, k, sm_scale), cast(dv, v), dc, None, None, None, None)


_ring.defvjp(_ring_fwd, _ring_bwd)


def context_steps(window, seq_len, axis_size):
  """How many shards' keys each device visits: all of them, or with a window only its own and
  the previous ones the band reaches."""
  if window is None or window >= seq_len:
    return axis_size
  return min(axis_size, 1 + math.ceil((window - 1) / (seq_len // axis_size)))

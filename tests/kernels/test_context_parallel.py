"""Context-parallel forgetting attention (the ring of kernels/context_parallel.py) equals the
materialized reference on the whole sequence: outputs and the four gradients, over 2, 4 and 8
devices, with packed documents and hard cuts that cross shard boundaries, windows narrower and
wider than a shard, pruning, float32 and bf16."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType

from lpcjax.kernels import BlockSizes, forgetting_attention, sharded_forgetting_attention
from lpcjax.kernels.context_parallel import context_steps
from lpcjax.kernels.pruning import skipped_tile_fraction

from float64_attention import forgetting_attention_float64, long_context_inputs, relative_errors
from test_forgetting_attention import make_inputs, value_and_grads

SEQ_LEN = 64
EPSILON = 1e-6


def mesh_of(shape, names):
  size = int(np.prod(shape))
  if len(jax.devices()) < size:
    pytest.skip(f"needs {size} devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
  return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(names), devices=jax.devices()[:size])


def packed_inputs(dtype, strong_decay=False):
  """Two sequences whose documents and cuts straddle the shard boundaries of every mesh below
  (multiples of 8), including a document id that comes back after another (0, 1, 0)."""
  q, k, v, log_f, do = make_inputs(3, 2, SEQ_LEN, 2, 8, dtype=dtype)
  if strong_decay:  # steep enough that pruning skips tiles at epsilon 1e-6
    log_f = 3.0 * log_f
  seg = np.zeros((2, SEQ_LEN), np.int32)
  seg[0, 13:33], seg[0, 50:] = 1, 2  # 0 ... 1 ... 0 ... 2
  seg[1, 7:] = 1
  log_f = log_f.at[0, 32, 1].set(-jnp.inf).at[1, 9, 0].set(-jnp.inf).at[1, 40, :].set(-jnp.inf)
  return q, k, v, log_f, do, jnp.asarray(seg)


def ring_value_and_grads(mesh, batch_axes, q, k, v, log_f, do, seg, **options):
  def loss(q, k, v, log_f):
    o = sharded_forgetting_attention(q, k, v, log_f, mesh=mesh, batch_axes=batch_axes, context_axis="context",
                                     segment_ids=seg, **options)
    return jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32)), o
  (_, o), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))(q, k, v, log_f)
  return o, grads


CASES = {  # name: (mesh shape, mesh axes, window, prune, dtype)
  "2dev": ((2,), ("context",), None, False, jnp.float32),
  "4dev_window_in_shard": ((4,), ("context",), 5, True, jnp.float32),  # shard 16 > window
  "8dev_window_over_shards": ((8,), ("context",), 20, False, jnp.float32),  # shard 8 < window
  "8dev_pruned": ((8,), ("context",), None, True, jnp.float32),
  "data2_context4": ((2, 4), ("data", "context"), None, False, jnp.float32),
  "4dev_bf16": ((4,), ("context",), None, False, jnp.bfloat16),
  "2dev_bf16_window_pruned": ((2,), ("context",), 24, True, jnp.bfloat16),
}


@pytest.mark.parametrize("case", CASES)
def test_ring_equals_reference(case):
  shape, names, window, prune, dtype = CASES[case]
  mesh = mesh_of(shape, names)
  q, k, v, log_f, do, seg = packed_inputs(dtype, strong_decay=prune)
  up = lambda x: x.astype(jnp.float32)
  o_ref, g_ref = value_and_grads("reference", up(q), up(k), up(v), log_f, up(do), segment_ids=seg, window=window)
  options = dict(window=window, block_sizes=BlockSizes(8, 8), prune_epsilon=EPSILON if prune else None)
  o, g = ring_value_and_grads(mesh, "data" if "data" in names else None, q, k, v, log_f, do, seg, **options)
  if prune:  # the inputs make pruning skip tiles, so the pruned path is what is compared
    assert skipped_tile_fraction(q, k, jnp.where(jnp.isneginf(log_f), 0.0, log_f), block_q=8, block_k=8,
                                 epsilon=EPSILON) > 0
  assert o.dtype == dtype
  names = ("dq", "dk", "dv", "dlog_fgate")
  if dtype == jnp.float32:  # pruning moves outputs by < 2 epsilon max|v| (pruning.py): below these
    np.testing.assert_allclose(o, o_ref, atol=1e-5, rtol=1e-5)
    for name, a, b in zip(names, g, g_ref):
      np.testing.assert_allclose(a, b, atol=5e-5, rtol=1e-4, err_msg=name)
  else:  # the bounds of test_forgetting_attention's bf16 test
    np.testing.assert_allclose(up(o), o_ref, atol=2e-2)
    for name, a, b, bound in zip(names, g, g_ref, (0.03, 0.03, 0.03, 1e-4)):
      assert float(jnp.max(jnp.abs(up(a) - b))) <= bound * float(jnp.max(jnp.abs(b))), name


def test_the_ring_moves_keys_by_collective_permute_only():
  """No all-gather of q, k, v or o: only the [batch, heads] totals of the cumulative sums and
  the segment counts are gathered; the keys travel by collective-permute."""
  mesh = mesh_of((4,), ("context",))
  q, k, v, log_f, do, seg = packed_inputs(jnp.float32)
  loss = lambda q, k, v, f: jnp.sum(sharded_forgetting_attention(
      q, k, v, f, mesh=mesh, context_axis="context", segment_ids=seg, block_sizes=BlockSizes(8, 8)) * do)
  hlo = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).lower(q, k, v, log_f).compile().as_text()
  assert hlo.count("collective-permute-start(") + hlo.count("collective-permute(") >= 4
  gathered = [line for line in hlo.splitlines() if "all-gather-start(" in line or "all-gather(" in line]
  for line in gathered:
    assert f",{SEQ_LEN}," not in line and f"[{SEQ_LEN}," not in line, line  # no full-length gather


def test_window_visits_only_the_shards_it_reaches():
  assert context_steps(None, 64, 8) == 8
  assert context_steps(5, 64, 4) == 2  # within a 16-token shard: itself and its predecessor
  assert context_steps(17, 64, 4) == 2  # 16 keys back: still the predecessor only
  assert context_steps(18, 64, 4) == 3
  assert context_steps(64, 64, 4) == 4  # the whole sequence: no window


def test_bad_context_parallel_calls_say_what_is_wrong():
  mesh = mesh_of((4,), ("context",))
  q, k, v, log_f, _, _ = packed_inputs(jnp.float32)
  with pytest.raises(ValueError, match="impl='reference' has no context-parallel path"):
    sharded_forgetting_attention(q, k, v, log_f, mesh=mesh, context_axis="context", impl="reference")
  short = lambda x: x[:, :60]
  with pytest.raises(ValueError, match="multiple of 8, got 60"):
    sharded_forgetting_attention(*map(short, (q, k, v, log_f)), mesh=mesh, context_axis="context")


def test_context_axis_of_size_one_runs_the_plain_op():
  mesh = mesh_of((1,), ("context",))
  q, k, v, log_f, _, seg = packed_inputs(jnp.float32)
  out = sharded_forgetting_attention(q, k, v, log_f, mesh=mesh, context_axis="context", segment_ids=seg)
  np.testing.assert_allclose(out, forgetting_attention(q, k, v, log_f, segment_ids=seg), atol=1e-6)


def test_ring_with_c_offset_matches_float64():
  """Long-context precision across shards (test_decay_precision.py on one device): log f in
  [-4, -1] with c offset by 5e4, so every shard's c and the earlier shards' totals are large;
  the ring's outputs and four gradients stay within 1e-4 of float64."""
  mesh = mesh_of((4,), ("context",))
  inputs = long_context_inputs(2, 1, 512, 1, 16, c_offset=5e4)
  q, k, v, log_f, do = (jnp.asarray(x) for x in inputs)
  o, grads = ring_value_and_grads(mesh, None, q, k, v, log_f, do, None, block_sizes=BlockSizes(32, 32))
  errors = relative_errors((o,) + tuple(grads), forgetting_attention_float64(*inputs))
  assert max(errors) <= 1e-4, errors


def test_padded_chunks_keep_pruning():
  """T = 96 over 4 devices: 8 chunks of 12 padded to tiles of 16. NaN in v[0:8] reaches only
  the rows whose tiles with keys 0..15 pruning does not skip; the ring's padding must not
  stop a skip (padded rows with c = 0 once made every padded query block look undecayed, and
  its rows NaN), so from row 48 on the ring is finite and equals one device."""
  mesh = mesh_of((4,), ("context",))
  q, k, v, log_f, _ = make_inputs(5, 1, 96, 2, 8)
  log_f = 6.0 * log_f - 1.0  # steep: tiles a chunk or more below their keys are skipped
  v = v.at[:, :8].set(jnp.nan)
  options = dict(block_sizes=BlockSizes(16, 16), prune_epsilon=EPSILON)
  one_device = jax.jit(lambda *x: forgetting_attention(*x, impl="xla", **options))(q, k, v, log_f)
  ring = jax.jit(lambda *x: sharded_forgetting_attention(*x, mesh=mesh, context_axis="context", **options))(
      q, k, v, log_f)
  assert bool(jnp.all(jnp.isfinite(one_device[:, 48:])))
  assert bool(jnp.all(jnp.isfinite(ring[:, 48:])))
  np.testing.assert_allclose(ring[:, 48:], one_device[:, 48:], atol=1e-5, rtol=1e-5)


def test_ring_with_grouped_query_attention_equals_reference():
  """k, v with 2 heads for 4 query heads, on a (heads 2, context 2) mesh with a window and
  pruning: K, V and dK, dV travel at the key/value heads, each device holds one key/value head
  and its group of 2 query heads. (One case: each ring compile takes ~20 s on 2 cores.)"""
  window = 20
  mesh = mesh_of((2, 2), ("heads", "context"))
  q, _, _, log_f, do = make_inputs(4, 2, SEQ_LEN, 4, 8)
  log_f = 3.0 * log_f  # steep enough that pruning skips tiles
  _, k, v, _, _, seg = packed_inputs(jnp.float32)  # 2 key/value heads
  o_ref, g_ref = value_and_grads("reference", q, k, v, log_f, do, segment_ids=seg, window=window)

  def loss(q, k, v, log_f):
    o = sharded_forgetting_attention(q, k, v, log_f, mesh=mesh, head_axes="heads", context_axis="context",
                                     segment_ids=seg, window=window, block_sizes=BlockSizes(8, 8),
                                     prune_epsilon=EPSILON)
    return jnp.sum(o * do), o
  (_, o), g = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))(q, k, v, log_f)
  np.testing.assert_allclose(o, o_ref, atol=1e-5, rtol=1e-5)
  for name, a, b in zip(("dq", "dk", "dv", "dlog_fgate"), g, g_ref):
    assert a.shape == b.shape, name
    np.testing.assert_allclose(a, b, atol=5e-5, rtol=1e-4, err_msg=name)

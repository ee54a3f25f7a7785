"""The TPU (Mosaic) kernels: against the reference at TPU-sized tiles in Pallas' TPU interpret
mode, their visit ranges against the pruning rule, and their lowering for TPU on this machine.

The backend suite (test_forgetting_attention.py) runs impl="pallas_tpu" too, at its own small
shapes; its streamed tiles are at least 128 wide (the TPU's lanes), so the multi-block sweeps,
windows that skip tiles and pruning need the longer sequences here. Each interpreted compile
of forward + backward takes seconds on 2 cores, so each case below packs several features.

Lowering for TPU runs on any jaxlib: Pallas' Mosaic lowering (block-shape rules, a lowering
rule per primitive), the tpu dialect's op verifiers and Mosaic's serialization. Mosaic's
layout passes and the TPU compiler live in libtpu and run only on a TPU (docs/kernels_tpu.md).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpcjax.kernels import (BlockSizes, forgetting_attention, pallas_tpu,
                            sharded_forgetting_attention)
from lpcjax.kernels.reference import tile_logits

from test_forgetting_attention import (INTERPRET, make_inputs, outside_window_finite, segments_from_starts,
                                       value_and_grads)


def test_tile_logits_2d_is_the_reference_formula():
  """Both orientations of the kernels' 2-D tile logits equal the reference's tile_logits."""
  rng = np.random.default_rng(0)
  rows, cols, q_start, k_start, window = 16, 24, 40, 30, 12
  qk = jnp.asarray(rng.normal(size=(rows, cols)), jnp.float32)
  c_q, c_k = (jnp.asarray(-np.sort(rng.uniform(0, 5, n)), jnp.float32) for n in (rows, cols))
  seg_q, seg_k = (jnp.asarray(rng.integers(0, 2, n), jnp.int32) for n in (rows, cols))
  q_pos = q_start + jnp.arange(rows)
  k_pos = k_start + jnp.arange(cols)
  for causal, band in ((True, window), (True, None), (False, None)):
    expected = tile_logits(qk, c_q, c_k, seg_q, seg_k, 0.3, q_start, k_start, causal, band)
    by_rows = pallas_tpu.tile_logits_2d(qk, c_q[:, None], c_k[None], seg_q[:, None], seg_k[None],
                                        q_pos[:, None], k_pos[None], 0.3, causal, band)
    by_cols = pallas_tpu.tile_logits_2d(qk.T, c_q[None], c_k[:, None], seg_q[None],
                                        seg_k[:, None], q_pos[None], k_pos[:, None], 0.3, causal,
                                        band)
    # Same masks; the kernels form c_i - c_j before adding it (one rounding apart).
    np.testing.assert_allclose(by_rows, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(by_cols, expected.T, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("window", [None, 200])
def test_visit_ranges_skip_exactly_the_tiles_the_rules_skip(window):
  """[lo, hi) per block holds every tile that is causal, in the window and not prunable
  (pruning.unless_skipped's rule), and no other, for both sweep directions."""
  batch, heads, seq_len, bq, bk = 1, 2, 1024, 64, 128
  rng = np.random.default_rng(1)
  log_f = np.log(rng.uniform(0.97, 1.0, size=(batch, heads, seq_len)))
  log_f[0, 1, 500:] = 0.0  # no decay from 500 on in head 1: nothing prunable there
  c = jnp.asarray(np.cumsum(log_f, axis=-1), jnp.float32)
  threshold = jnp.asarray([[-3.0, -3.0]], jnp.float32)
  q_first = np.arange(seq_len // bq)[:, None] * bq
  k_first = np.arange(seq_len // bk)[None, :] * bk
  cn = np.asarray(c)
  gap = (cn.reshape(batch, heads, -1, bq).max(-1)[..., :, None]
         - cn.reshape(batch, heads, -1, bk).min(-1)[..., None, :])
  visible = k_first <= q_first + bq - 1
  if window is not None:
    visible = visible & (q_first - (k_first + bk - 1) < window)
  expected = visible & ~(gap < np.asarray(threshold)[..., None, None])  # [B, H, nq, nk]
  assert 0 < expected.sum() < visible.sum() * batch * heads

  # The grid's schedule: exactly the causal, in-window tiles, each outer block's in a run.
  _, _, static_lo, static_hi = pallas_tpu.key_ranges(c, None, bq, bk, window)
  steps = pallas_tpu.schedule(static_lo, static_hi)
  outer, inner, first, last = (np.asarray(x) for x in pallas_tpu.decode_step(jnp.asarray(steps)))
  scheduled = np.zeros_like(visible)
  scheduled[outer, inner] = True
  assert len(steps) == visible.sum() and (scheduled == visible).all()
  assert np.all(np.diff(outer) >= 0) and first.sum() == last.sum() == seq_len // bq

  lo, hi, *_ = pallas_tpu.key_ranges(c, threshold, bq, bk, window)
  k_block = np.arange(seq_len // bk)
  kept = (k_block >= np.asarray(lo)[..., None]) & (k_block < np.asarray(hi)[..., None])
  np.testing.assert_array_equal(kept, expected)
  lo, hi, *_ = pallas_tpu.query_ranges(c, threshold, bq, bk, window)
  q_block = np.arange(seq_len // bq)
  kept = (q_block >= np.asarray(lo)[..., None]) & (q_block < np.asarray(hi)[..., None])
  np.testing.assert_array_equal(kept, np.swapaxes(expected, -1, -2))


def assert_matches_reference(o, g, o_ref, g_ref, atol):
  np.testing.assert_allclose(o, o_ref, atol=atol, rtol=1e-5)
  for name, a, b in zip(("dq", "dk", "dv", "dlog_fgate"), g, g_ref):
    np.testing.assert_allclose(a, b, atol=5 * atol, rtol=1e-4, err_msg=name)


def test_float32_partial_tiles_segments_and_cut():
  """T = 333 (partial tiles in every pass), unequal tiles per pass, two segments, a hard cut
  in one head, head_dim 64."""
  seq_len = 333
  q, k, v, log_f, do = make_inputs(11, 1, seq_len, 2, 64)
  log_f = log_f.at[0, 150, 1].set(-jnp.inf)
  seg = segments_from_starts(1, seq_len, [77, 260])
  sizes = BlockSizes(block_q=32, block_k=128, block_q_dkv=128, block_k_dkv=64, block_q_dq=64,
                     block_k_dq=128)
  o_ref, g_ref = value_and_grads("reference", q, k, v, log_f, do, segment_ids=seg)
  o, g = value_and_grads("pallas_tpu", q, k, v, log_f, do, segment_ids=seg, block_sizes=sizes)
  assert_matches_reference(o, g, o_ref, g_ref, atol=2e-5)
  assert float(g[3][0, 150, 1]) == 0.0


def test_float32_window_and_pruning_across_many_tiles():
  """A window of 150 over 520 positions (tiles wholly outside it skipped, tiles crossing its
  edge masked) with pruning on top and unequal tiles per pass."""
  seq_len = 520
  q, k, v, log_f, do = make_inputs(12, 1, seq_len, 2, 32)
  seg = segments_from_starts(1, seq_len, [410])
  sizes = BlockSizes(block_q=64, block_k=128, block_q_dkv=128, block_k_dkv=64, block_q_dq=64,
                     block_k_dq=128)
  options = dict(segment_ids=seg, window=150)
  o_ref, g_ref = value_and_grads("reference", q, k, v, log_f, do, **options)
  o, g = value_and_grads("pallas_tpu", q, k, v, log_f, do, block_sizes=sizes, prune_epsilon=1e-7,
                         **options)
  assert_matches_reference(o, g, o_ref, g_ref, atol=2e-5)


def test_bfloat16_window_segments_and_pruning():
  """bf16 q/k/v at TPU tiles: o within 2e-2, dq/dk/dv within 3% of their largest entry, and
  d log f within 1e-4 of its largest (the recomputed row term, row_term.py)."""
  seq_len = 300
  q, k, v, log_f, do = make_inputs(13, 1, seq_len, 2, 128, dtype=jnp.bfloat16)
  seg = segments_from_starts(1, seq_len, [140])
  up = lambda x: x.astype(jnp.float32)
  options = dict(segment_ids=seg, window=180)
  o_ref, g_ref = value_and_grads("reference", up(q), up(k), up(v), log_f, up(do), **options)
  o, g = value_and_grads("pallas_tpu", q, k, v, log_f, do, prune_epsilon=1e-6,
                         block_sizes=BlockSizes(block_q=64, block_k=128), **options)
  assert o.dtype == jnp.bfloat16
  np.testing.assert_allclose(up(o), o_ref, atol=2e-2)
  bounds = (0.03, 0.03, 0.03, 1e-4)
  for name, a, b, bound in zip(("dq", "dk", "dv", "dlog_fgate"), g, g_ref, bounds):
    assert float(jnp.max(jnp.abs(up(a) - b))) <= bound * float(jnp.max(jnp.abs(b))), name


def test_tiles_outside_the_window_are_never_loaded():
  """As the suite's NaN test, at TPU tiles (128): NaN keys/values in key block 0 (batch 0)
  must not reach query blocks whose window starts after it, NaN queries/dO in the last query
  block (batch 1) must not reach key blocks whose window ends before it. A streamed block
  outside [lo, hi) is not even copied: the index map clamps it into the range."""
  assert outside_window_finite("pallas_tpu", 14, 128, 512, 100) == (True,) * 4
  assert outside_window_finite("reference", 14, 128, 512, 100) == (False,) * 4  # the poison does reach them


def test_pruned_tiles_are_never_loaded():
  """NaN values in key block 0 reach the query blocks next to it, but not those whose decay
  since then prunes the tile (forward; the gradients' pruning is the same ranges' business)."""
  block, seq_len = 128, 512
  q, k, v, _, _ = make_inputs(15, 1, seq_len, 1, 16)
  q, k = 0.1 * q, 0.1 * k  # small norms: a loose bound, so the decay alone decides
  log_f = jnp.full(q.shape[:3], -0.12, jnp.float32)
  v = v.at[:, :block].set(jnp.nan)
  o = forgetting_attention(q, k, v, log_f, impl="pallas_tpu", interpret=INTERPRET["pallas_tpu"],
                           prune_epsilon=1e-2, block_sizes=BlockSizes(block, block))
  finite = np.isfinite(np.asarray(o[0, :, 0])).all(axis=-1)
  assert not finite[block:2 * block].any() and finite[3 * block:].all()


# ---------------------------------------------------------------------- lowering for TPU

@pytest.fixture
def pretend_tpu(monkeypatch):
  # The backend refuses un-interpreted calls off-TPU; here nothing runs, it only lowers.
  monkeypatch.setattr(pallas_tpu, "on_tpu", lambda: True)


def lower_for_tpu(head_dim, dtype, seq_len=1000, remat=False, heads=2, kv_heads=2, **options):
  def loss(q, k, v, log_f, seg):
    attend = lambda *args: forgetting_attention(*args, segment_ids=seg, impl="pallas_tpu",
                                                **options)
    o = (jax.checkpoint(attend) if remat else attend)(q, k, v, log_f)
    return jnp.sum(o.astype(jnp.float32))
  q = jax.ShapeDtypeStruct((1, seq_len, heads, head_dim), dtype)
  kv = jax.ShapeDtypeStruct((1, seq_len, kv_heads, head_dim), dtype)
  args = (q, kv, kv, jax.ShapeDtypeStruct((1, seq_len, heads), jnp.float32),
          jax.ShapeDtypeStruct((1, seq_len), jnp.int32))
  grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
  return grad.trace(*args).lower(lowering_platforms=("tpu",)).as_text()


# forward, dK/dV/dc, dQ, and for bf16/fp16 the row-term kernel
KERNELS = {jnp.bfloat16: 4, jnp.float16: 4, jnp.float32: 3}


@pytest.mark.parametrize("head_dim", pallas_tpu.SUPPORTED_HEAD_DIMS)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_kernels_lower_for_tpu(pretend_tpu, head_dim, dtype):
  """Default tiles; 1000 is no multiple of them; window, pruning and segments on."""
  text = lower_for_tpu(head_dim, dtype, window=300, prune_epsilon=1e-4)
  assert text.count("tpu_custom_call") == KERNELS[dtype]


def test_grouped_query_attention_lowers_for_tpu(pretend_tpu):
  """k, v with 2 heads for 8 query heads (the k/v block specs read head h // 4), with a window,
  pruning and segments."""
  text = lower_for_tpu(128, jnp.bfloat16, heads=8, kv_heads=2, window=300, prune_epsilon=1e-4)
  assert text.count("tpu_custom_call") == KERNELS[jnp.bfloat16]


def test_lowers_for_tpu_under_x64_with_small_tiles(pretend_tpu, x64):
  """Under jax_enable_x64 Python ints trace as int64 next to the int32 program ids; the
  smallest tiles the TPU takes (128: every block is the lane dim of its vectors' rows)."""
  text = lower_for_tpu(64, jnp.float16, seq_len=300, window=40, prune_epsilon=1e-4,
                       block_sizes=BlockSizes(8, 8))
  assert text.count("tpu_custom_call") == KERNELS[jnp.float16]


def test_position_vectors_reach_the_kernels_compact(pretend_tpu):
  """c's two parts, ids, lse, delta and dc travel as [B, H, 1, T] rows, 4 bytes a (position,
  head), into and out of every kernel; none as a [B, H, T, 128] lane-broadcast column (512
  bytes: about 6 GiB of the backward at 8 x 16 heads x 16k once, benchmarks/tpu_backward_memory.py)
  or an [B, H, 8, T] sublane broadcast."""
  text = lower_for_tpu(64, jnp.bfloat16, seq_len=512, window=300, prune_epsilon=1e-4)
  calls = [line for line in text.splitlines() if "tpu_custom_call" in line]
  assert len(calls) == KERNELS[jnp.bfloat16]
  for line in calls:
    assert "1x2x1x512xf32" in line and "1x2x1x512xi32" in line
    assert "x512x128x" not in line and "x8x512x" not in line


def test_lowers_for_tpu_under_remat(pretend_tpu):
  """Under jax.checkpoint the backward recomputes the forward: its kernel appears twice. (TPU
  interpret mode cannot run under remat: its simulated memory is an effect that remat refuses.)"""
  text = lower_for_tpu(128, jnp.bfloat16, remat=True)
  assert text.count("tpu_custom_call") == KERNELS[jnp.bfloat16] + 1
  assert text.count("forgetting_attention_tpu_fwd") >= 2


def test_lowers_for_tpu_under_shard_map(pretend_tpu):
  """The sharded path (kernels/sharded.py) on an abstract 2 x 2 TPU mesh, batch and heads
  split: each device runs the kernels on its shard."""
  from jax.sharding import AxisType
  device = jax.sharding.AbstractDevice(device_kind="TPU v5 lite", num_cores=None, platform="tpu")
  mesh = jax.sharding.AbstractMesh((2, 2), ("data", "tensor"), (AxisType.Auto,) * 2,
                                   abstract_device=device)

  def loss(q, k, v, log_f):
    o = sharded_forgetting_attention(q, k, v, log_f, mesh=mesh, batch_axes="data",
                                     head_axes="tensor", impl="pallas_tpu")
    return jnp.sum(o.astype(jnp.float32))
  qkv = jax.ShapeDtypeStruct((4, 256, 4, 128), jnp.bfloat16)
  gate = jax.ShapeDtypeStruct((4, 256, 4), jnp.float32)
  with jax.sharding.use_abstract_mesh(mesh):
    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).trace(qkv, qkv, qkv, gate).lower(
        lowering_platforms=("tpu",)).as_text()
  assert text.count("tpu_custom_call") == KERNELS[jnp.bfloat16]
  assert "manual_computation" in text or "shard_map" in text


def test_block_sizes_fit_the_tpu_tiling_and_vmem():
  sizes = pallas_tpu.tpu_block_sizes(BlockSizes(8, 8), 1000, jnp.bfloat16, 64)
  assert sizes == BlockSizes(*[128] * 6)  # every block is the lane dim of its vectors' rows
  assert pallas_tpu.tpu_block_sizes(None, 100, jnp.float32, 64) == BlockSizes(*[128] * 6)
  for dtype in (jnp.bfloat16, jnp.float32):
    for head_dim in pallas_tpu.SUPPORTED_HEAD_DIMS:
      size = pallas_tpu.default_block_sizes(head_dim, dtype).block_q
      assert pallas_tpu.vmem_bytes(size, size, head_dim, dtype) <= pallas_tpu.VMEM_BUDGET_BYTES
  assert pallas_tpu.default_block_sizes(128, jnp.bfloat16) == BlockSizes(512, 512)


def test_unsupported_use_is_refused_in_one_line():
  q, k, v, log_f, _ = make_inputs(0, 1, 8, 2, 48)
  with pytest.raises(ValueError, match=r"impl='pallas_tpu' supports head_dim in"):
    forgetting_attention(q, k, v, log_f, impl="pallas_tpu", interpret=True)
  if jax.default_backend() != "tpu":
    q, k, v, log_f, _ = make_inputs(0, 1, 8, 2, 64)
    with pytest.raises(ValueError, match="needs a TPU"):
      forgetting_attention(q, k, v, log_f, impl="pallas_tpu")


def test_auto_picks_the_tpu_kernel_on_tpu(monkeypatch):
  from lpcjax.kernels import resolve
  monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
  assert resolve("auto", 64).name == resolve("auto", 128).name == "pallas_tpu"
  assert resolve("auto", 48).name == "xla"  # unsupported by the kernel: the blockwise op

"""impl="mosaic_gpu" (kernels/mosaic_gpu.py) in JAX's Mosaic GPU interpreter, against the float64
ground truth (tests/float64_attention.py): outputs and the four gradients, bf16 and fp16, D = 64
and 128, a ragged T, grouped K/V, segments, hard cuts and a window; one case with the
interpreter's race detector on. Runs where jax >= 0.11.2 has the interpreter (Python 3.12:
.ci/run_py312); elsewhere only the one-line errors are checked.

Error limits: max |x - x64| / max |x64| of 1.5e-2 (bf16) and 5e-3 (fp16), several times what
rounding the inputs' dtype gives (bf16 about 3.5e-3 here), far below a wrong mask or decay.
"""

import dataclasses
import re

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from float64_attention import grouped_forgetting_attention_float64 as float64, long_context_inputs, relative_errors
from lpcjax.kernels import forgetting_attention, mosaic_gpu, row_term

needs_interpreter = pytest.mark.skipif(not mosaic_gpu.available(),
                                       reason="needs jax >= 0.11.2's Mosaic GPU interpreter (Python >= 3.12)")
LIMITS = {"bfloat16": 1.5e-2, "float16": 5e-3}


def run(q, k, v, log_f, do, dtype, impl="mosaic_gpu", **options):
  """o and the four gradients of sum(o * dO), float32 numpy, from inputs rounded to dtype."""
  def loss(q, k, v, log_f):
    o = forgetting_attention(q, k, v, log_f, impl=impl, interpret=True, **options)
    return jnp.sum(o.astype(jnp.float32) * do), o
  (_, o), grads = jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(
      *(jnp.asarray(x, dtype) for x in (q, k, v)), jnp.asarray(log_f))
  return [np.asarray(x.astype(jnp.float32)) for x in (o, *grads)]


def case(seq_len, heads, kv_heads, head_dim, dtype, seed=0, gates=(0.97, 1.0)):
  rng = np.random.default_rng(seed)
  rounded = lambda shape: np.asarray(jnp.asarray(rng.normal(size=shape), dtype).astype(jnp.float32))
  q, do = rounded((1, seq_len, heads, head_dim)), rounded((1, seq_len, heads, head_dim))
  k, v = rounded((1, seq_len, kv_heads, head_dim)), rounded((1, seq_len, kv_heads, head_dim))
  log_f = np.log(rng.uniform(*gates, size=(1, seq_len, heads))).astype(np.float32)
  return q, k, v, log_f, do


def assert_close(results, truth, dtype):
  errors = dict(zip(("o", "dq", "dk", "dv", "dlog_f"), relative_errors(results, truth)))
  assert max(errors.values()) < LIMITS[dtype], errors


# (T, heads, kv heads, D, dtype, window, segment starts)
CASES = {
    "bf16-D64": (256, 2, 2, 64, "bfloat16", None, ()),
    "fp16-D128-ragged": (200, 1, 1, 128, "float16", None, ()),
    "bf16-gqa2-segments": (256, 4, 2, 64, "bfloat16", None, (90, 130)),
    "bf16-window48-segments": (256, 2, 2, 64, "bfloat16", 48, (150,)),
    # padded to 256 after the last segment, and to 128 after a boundary inside the last block:
    # the ids the kernels see must not fall back to 0 there (version 2's corner test)
    "bf16-ragged-segments": (200, 1, 1, 64, "bfloat16", None, (40, 150)),
    "bf16-ragged-boundary-in-last-block": (100, 1, 1, 64, "bfloat16", None, (80,)),
}


@needs_interpreter
@pytest.mark.parametrize("name, impl", [(name, "mosaic_gpu") for name in CASES]
                         + [("bf16-window48-segments", "mosaic_gpu_v1")]
                         + [(name, "mosaic_gpu_fused") for name in ("fp16-D128-ragged", "bf16-gqa2-segments",
                                                                    "bf16-window48-segments")])
def test_outputs_and_gradients_match_float64(name, impl):
  """Version 2 (impl="mosaic_gpu": interior tiles unmasked, pruning as the sweeps' bounds) on
  every case; version 1, kept to compare, on the one with every mask; the one-kernel backward
  (impl="mosaic_gpu_fused": two warpgroups meeting on barriers, dQ summed over the key blocks) on
  D = 128, grouped K/V and the window."""
  assert_case_matches_float64(name, impl)


def assert_case_matches_float64(name, impl):
  seq_len, heads, kv_heads, head_dim, dtype, window, starts = CASES[name]
  inputs = case(seq_len, heads, kv_heads, head_dim, dtype)
  segment_ids = None
  if starts:
    segment_ids = np.zeros((1, seq_len), np.int32)
    for start in starts:
      segment_ids[:, start:] += 1
  results = run(*inputs, dtype, impl, segment_ids=None if segment_ids is None else jnp.asarray(segment_ids),
                window=window)
  assert_close(results, float64(*inputs, segment_ids, window), dtype)


@pytest.fixture
def race_detector(monkeypatch):
  """The interpreter with its race detector on, and its record cleared: the test asserts
  ``not race_detector.get_races().races_found`` at its end."""
  from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call as interpreter
  monkeypatch.setattr(mosaic_gpu, "DETECT_RACES", True)
  interpreter.reset_gpu_interpret_mode_state()
  return interpreter


@needs_interpreter
@pytest.mark.parametrize("name", ["bf16-window48-segments", "fp16-D128-ragged"])
def test_the_forwards_warpgroups_taking_turns_match_float64_without_a_race(monkeypatch, race_detector, name):
  """``Version.taking_turns`` (the hardware path's schedule, which the interpreter cannot run)
  on the tested path: the token passes without a deadlock (a turn too few hangs the
  interpreter: tried), with the race detector on, and the numbers are version 2's. The window
  case has tiles one warpgroup skips while the other computes them; D = 128 runs 64-key tiles."""
  handed_over = []
  hand_over = mosaic_gpu._Turns.hand_over
  monkeypatch.setattr(mosaic_gpu, "_forward_takes_turns", lambda version, head_dim, two_part: True)
  monkeypatch.setattr(mosaic_gpu._Turns, "hand_over", lambda turn: (handed_over.append(1), hand_over(turn))[1])
  assert_case_matches_float64(name, "mosaic_gpu")
  assert handed_over  # the forward was built taking turns
  assert not race_detector.get_races().races_found


@needs_interpreter
@pytest.mark.parametrize("seq_len, head_dim, dtype", [(512, 64, "bfloat16"), (320, 128, "float16")])
def test_the_forward_releases_k_early_without_a_race(monkeypatch, race_detector, seq_len, head_dim, dtype):
  """``Version.early_key_release`` (the hardware path's, which the interpreter cannot run) on
  the tested path: K's stage and the keys' vectors' wait for their copies and go back to the
  copying warpgroup apart from V's, K's as soon as S is in the registers, so that the key block
  two steps on loads while P V runs. Both cases have more key blocks than stages (128 keys a tile
  at D = 64, 64 at D = 128), so the stages are refilled; outputs and gradients match float64, and
  the race detector (TMA and plain SMEM traffic; it does not see wgmma's reads, docs) finds
  nothing. Releasing K before S is computed fails both on the numbers (tried: o off by 4 % and
  25 %; the interpreter's copy lands when it is issued)."""
  from lpcjax.kernels import backends
  for table in ("_BACKENDS", "_SOURCES"):  # the variant is registered for this test only
    monkeypatch.setattr(backends, table, dict(getattr(backends, table)))
  version = dataclasses.replace(mosaic_gpu.V2, name="mosaic_gpu_early_release", early_key_release=True)
  mosaic_gpu._register(version, priority=None)
  released = []  # per stage released while tracing: whether it had barriers of its own
  release = mosaic_gpu._Stage.release
  monkeypatch.setattr(mosaic_gpu._Stage, "release", lambda stage: (released.append(stage.consumed is not None),
                                                                   release(stage))[1])
  blocks = seq_len // mosaic_gpu.forward_key_tile(version, head_dim)
  assert blocks > mosaic_gpu.STAGES
  inputs = case(seq_len, 2, 1, head_dim, dtype)
  assert_close(run(*inputs, dtype, version.name), float64(*inputs, None, None), dtype)
  assert released and all(released)  # built with the stages' barriers, each released by hand
  assert not race_detector.get_races().races_found


@needs_interpreter
def test_the_forward_without_a_gradient_runs_the_one_part_kernel(monkeypatch):
  """Outside a gradient version 2 runs the forward with two matmuls per tile (o only), under one
  the two-part forward: each matches float64, and the two differ by o's rounding at most."""
  seq_len, heads, kv_heads, head_dim, dtype, window, starts = CASES["bf16-window48-segments"]
  q, k, v, log_f, do = case(seq_len, heads, kv_heads, head_dim, dtype)
  segment_ids = (np.arange(seq_len) >= starts[0]).astype(np.int32)[None]
  options = dict(segment_ids=jnp.asarray(segment_ids), window=window)
  built = []  # the forward kernels traced: two_part or not
  forward_call = mosaic_gpu._forward_call

  def spy(*args, two_part=False, **kwargs):
    built.append(two_part)
    return forward_call(*args, two_part=two_part, **kwargs)
  monkeypatch.setattr(mosaic_gpu, "_forward_call", spy)
  o = forgetting_attention(*(jnp.asarray(x, dtype) for x in (q, k, v)), jnp.asarray(log_f), impl="mosaic_gpu",
                           interpret=True, **options)
  truth = float64(q, k, v, log_f, do, segment_ids, window)
  assert relative_errors([o.astype(jnp.float32)], truth[:1])[0] < LIMITS[dtype]
  o_for_gradient = run(q, k, v, log_f, do, dtype, **options)[0]
  assert built == [False, True]
  assert np.max(np.abs(np.asarray(o.astype(jnp.float32)) - o_for_gradient)) < 2 ** -7 * np.max(np.abs(o_for_gradient))


@needs_interpreter
def test_the_row_term_read_off_the_two_part_output_keeps_d_log_f_exact(monkeypatch):
  """Version 2 has no row-term kernel: the forward run for a gradient writes o in two parts (P's
  rounding residual times V included), delta_i = dO_i . (o_i + o_lo_i), and the dQ kernel adds the
  rows' sums of dS to dc (row_term.py). d log f measured 4.6e-6 here (version 2 as it is; 4.3e-6
  before its forward's 128-key tiles and 4.6e-6 without the folded decay: one-off runs of the
  test's inputs; version 1's row term 9.4e-7);
  delta from the bf16 output alone gives 4.1e-3 (2.9e-2 without the rows' sums: the official FoX
  kernel's route)."""
  inputs = case(512, 1, 1, 64, "bfloat16", gates=(0.3, 1.0))
  truth = float64(*inputs)
  assert relative_errors(run(*inputs, "bfloat16"), truth)[4] < 2e-5
  monkeypatch.setattr(row_term, "RECOMPUTE", False)  # o rounded to bf16, one part
  assert relative_errors(run(*inputs, "bfloat16"), truth)[4] > 1e-3


@needs_interpreter
def test_o_lo_is_bf16_for_fp16_inputs_where_o_is_small():
  """o's second part is o - fp16(o), about 2^-11 |o|: in fp16 it would fall into the subnormals
  where |o| is small (V scaled by 0.01 here), d log f 1.5e-5; in bf16 7.4e-7 (7.0e-7 before the
  forward's 128-key tiles, 5.0e-7 without the folded decay; one-off runs of the test's inputs)."""
  q, k, v, log_f, do = case(512, 1, 1, 64, "float16", gates=(0.99, 1.0))
  v = np.asarray(jnp.asarray(v * 0.01, jnp.float16).astype(jnp.float32))
  errors = relative_errors(run(q, k, v, log_f, do, "float16"), float64(q, k, v, log_f, do))
  assert errors[4] < 3e-6, errors


@needs_interpreter
@pytest.mark.parametrize("impl", ["mosaic_gpu", "mosaic_gpu_fused"])
def test_a_hard_cut_and_strong_gates_with_the_race_detector_on(race_detector, impl):
  """The race detector on (for the one-kernel backward: its warpgroups' P^T and dS^T tiles,
  rewritten each step, on two barriers)."""
  q, k, v, log_f, do = case(128, 1, 1, 64, "bfloat16", seed=1, gates=(0.02, 0.4))
  log_f[:, 70] = -np.inf  # a hard cut: nothing before position 70 is seen after it
  results = run(q, k, v, log_f, do, "bfloat16", impl)
  assert not race_detector.get_races().races_found
  segment_ids = (np.arange(128) >= 70).astype(np.int32)[None]
  truth = float64(q, k, v, np.where(np.isinf(log_f), 0.0, log_f), do, segment_ids)
  assert_close(results[:4], truth[:4], "bfloat16")  # d log f at the cut itself is not defined
  np.testing.assert_allclose(np.delete(results[4], 70, axis=1), np.delete(truth[4], 70, axis=1), atol=2e-2)


@needs_interpreter
def test_the_decay_keeps_its_two_float_parts_far_from_zero():
  """c offset by 5e4 (log f_0 lowered: no weight changes) with strong gates, float16: as exact as
  at offset 0, where a float32 c gives 6.6e-4 (decay.py, issue #34). d log f measured 9.9e-6 at
  offset 5e4 and 7.5e-6 at 0 with version 2 (the folded decay, 128-key forward tiles), 2.2e-6
  and 3.4e-6 with 64-key ones, 8.2e-7 either way unfolded (benchmarks/mosaic_gpu_decay_fold.py
  --seq-len 256 --seeds 0 --cases strong strong_offset5e4)."""
  q, k, v, log_f, do = long_context_inputs(0, 1, 256, 1, 64, (-4.0, -1.0), c_offset=5e4)
  rounded = lambda x: np.asarray(jnp.asarray(x, jnp.float16).astype(jnp.float32))
  q, k, v, do = map(rounded, (q, k, v, do))
  errors = relative_errors(run(q, k, v, log_f, do, "float16"), float64(q, k, v, log_f, do))
  assert max(errors[:4]) < 2e-3 and errors[4] < 2e-5, errors


@needs_interpreter
@pytest.mark.parametrize("impl", ["mosaic_gpu", "mosaic_gpu_v1", "mosaic_gpu_fused"])
def test_pruning_skips_decayed_tiles_unread_and_stays_within_its_bound(impl):
  """Version 2's sweeps start (dQ) and end (dK/dV) where pruning allows; version 1 and the
  one-kernel backward test each tile: all skip the same tiles, and none reads a skipped tile's
  values."""
  q, k, v, log_f, do = case(256, 1, 1, 64, "float16", gates=(0.05, 0.2))
  epsilon = 1e-2
  pruned = run(q, k, v, log_f, do, "float16", impl, prune_epsilon=epsilon)
  exact = run(q, k, v, log_f, do, "float16", impl)
  assert np.max(np.abs(pruned[0] - exact[0])) < 2 * epsilon * np.max(np.abs(v))  # pruning.py's bound
  for a, b in zip(pruned[1:], exact[1:]):
    np.testing.assert_allclose(a, b, atol=1e-3 * np.max(np.abs(b)))
  # NaN in the values of the forward's first key tile (64 keys, or 128 with wide_forward_keys,
  # whose tiles mask a pruned 64-key prefix but read its values): the rows from one block of 64
  # past it, whose tiles with it the bound skips, never read it (their outputs and dQ stay finite);
  # without pruning every row reads it
  width = mosaic_gpu.forward_key_tile(mosaic_gpu.VERSIONS[impl], 64)
  assert width == (64 if impl == "mosaic_gpu_v1" else 128)
  v = v.copy()
  v[:, :width] = np.nan
  pruned = run(q, k, v, log_f, do, "float16", impl, prune_epsilon=epsilon)
  exact = run(q, k, v, log_f, do, "float16", impl)
  for result in (pruned[0], pruned[1]):
    assert np.isfinite(result[:, width + 64:]).all() and np.isnan(result[:, width:width + 64]).any()
  assert np.isnan(exact[0][:, width + 64:]).all()


@needs_interpreter
def test_the_wide_forward_prunes_the_backward_tiles_exactly(monkeypatch):
  """The forward's 128-key tiles (Version.wide_forward_keys) prune per block of 64 keys, as the
  backward's tiles do: a tile whose first 64 keys pruning may skip and whose last 64 it keeps
  masks the first 64. lse (the forward's, base 2) is float64's over the keys the backward keeps;
  one step of -10.5 in log f, with q, k near 0 (bound about -10.1), puts about 6e-5 of row 128's
  weight on keys 0..63, so a forward that skipped only whole 128-key tiles would be off by that."""
  seq_len, block, epsilon = 256, mosaic_gpu.ANCHOR_BLOCK, 1e-2
  q, k, v, log_f, do = case(seq_len, 1, 1, 64, "float16")
  q, k = q * 1e-3, k * 1e-3
  log_f = np.zeros_like(log_f)
  log_f[:, 100] = -10.5
  seen = []
  forward_call = mosaic_gpu._forward_call

  def spy(*args, **kwargs):
    outputs = forward_call(*args, **kwargs)
    seen.append((args[3], args[6], outputs[-1]))  # c's high part, the threshold, lse2 [BH, T]
    return outputs
  monkeypatch.setattr(mosaic_gpu, "_forward_call", spy)
  forgetting_attention(*(jnp.asarray(x, jnp.float16) for x in (q, k, v)), jnp.asarray(log_f), impl="mosaic_gpu",
                       interpret=True, prune_epsilon=epsilon)
  (hi, thr, lse2), = seen
  hi, thr, lse2 = (np.asarray(x)[0] for x in (hi, thr, lse2))
  assert mosaic_gpu.forward_key_tile(mosaic_gpu.V2, 64) == 2 * block

  def float64_lse2(key_block):
    """lse2 over the keys kept by pruning's test on tiles of 64 rows and ``key_block`` keys."""
    qf, kf = (np.asarray(jnp.asarray(x, jnp.float16), np.float64)[0, :, 0] for x in (q, k))
    c = np.cumsum(log_f[0, :, 0].astype(np.float64))
    logits = (qf @ kf.T / 8.0 + c[:, None] - c[None, :]) * np.log2(np.e)
    i, j = np.arange(seq_len)[:, None], np.arange(seq_len)[None, :]
    pruned = hi[i // block * block] - hi[(j // key_block + 1) * key_block - 1] < thr[0]
    logits = np.where((j <= i) & ~pruned, logits, -np.inf)
    return np.log2(np.sum(np.exp2(logits - logits.max(axis=1, keepdims=True)), axis=1)) + logits.max(axis=1)

  exact, whole_tiles = float64_lse2(block), float64_lse2(2 * block)
  assert np.max(np.abs(exact - whole_tiles)) > 5e-5  # the two sets differ measurably
  assert np.max(np.abs(lse2 - exact)) < 5e-6, np.max(np.abs(lse2 - exact))


# (T, heads, kv heads, D, dtype, options)
LOWERED = {
    "bf16-D64-gqa2-segments-pruned": (512, 4, 2, 64, jnp.bfloat16, dict(prune_epsilon=1e-4, segments=True)),
    "fp16-D128-T16k-window-pruned": (16384, 2, 2, 128, jnp.float16, dict(prune_epsilon=1e-4, window=512)),
}


@needs_interpreter
@pytest.mark.parametrize("name, impl", [(name, impl) for name in LOWERED
                                         for impl in ("mosaic_gpu", "mosaic_gpu_hw", "mosaic_gpu_fused")])
def test_forward_and_backward_lower_for_hopper_without_a_gpu(monkeypatch, name, impl):
  """The Python half of Mosaic GPU's compile for sm_90 runs without a GPU (jax assumes 9.0):
  layout inference, wgmma's shape and transpose rules, the 227 KiB shared-memory budget, which
  the interpreter does not check; for the hardware-only path too (register operands, ACC.init),
  which the interpreter cannot run. (ptxas and registers: test_compile_for_chips.py.)"""
  seq_len, heads, kv_heads, head_dim, dtype, options = LOWERED[name]
  monkeypatch.setattr(mosaic_gpu, "on_gpu", lambda: True)
  options = dict(options)  # LOWERED's own stays as it is for the next case
  segments = options.pop("segments", False)

  def loss(q, k, v, log_f, segment_ids=None):
    o = forgetting_attention(q, k, v, log_f, impl=impl, segment_ids=segment_ids, **options)
    return jnp.sum(o.astype(jnp.float32))
  q = jax.ShapeDtypeStruct((1, seq_len, heads, head_dim), dtype)
  kv = jax.ShapeDtypeStruct((1, seq_len, kv_heads, head_dim), dtype)
  args = (q, kv, kv, jax.ShapeDtypeStruct((1, seq_len, heads), jnp.float32))
  if segments:
    args += (jax.ShapeDtypeStruct((1, seq_len), jnp.int32),)
  lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).trace(*args).lower(lowering_platforms=("cuda",))
  # the two-part forward, then dQ and dK/dV (no row-term kernel), or the one-kernel backward
  expected = ("fwd_two_part", "dq", "dkv") if impl == "mosaic_gpu" else ("fwd_two_part", "dkv_dq")
  kernels = re.findall(r"custom_call @(mosaic_gpu\w*)", lowered.as_text())
  assert len(kernels) == len(expected), kernels
  names = set(re.findall(r"forgetting_attention_mgpu_(fwd_two_part|dkv_dq|dq|dkv)(_hw)?_mosaic_gpu",
                         lowered.as_text()))
  suffix = "_hw" if impl == "mosaic_gpu_hw" else ""  # a profile tells the hardware path's kernels apart
  assert names == {(kernel, suffix) for kernel in expected}, names
  # TMA reads and writes q, k, v, dO and the outputs in the caller's [B, T, H, D] (mosaic_gpu._head):
  # no heads-major copy of any of them on either side of the kernels
  copies = re.findall(r"stablehlo.transpose [^\n]*\(tensor<1x\d+x\d+x%dx" % head_dim, lowered.as_text())
  assert not copies, copies


@pytest.mark.parametrize("impl, dtype, head_dim, message", [
    ("mosaic_gpu", jnp.float32, 64, "supports dtypes ('bfloat16', 'float16'), got float32"),
    ("mosaic_gpu", jnp.bfloat16, 32, "supports head_dim in (64, 128), got 32"),
    ("mosaic_gpu_hw", jnp.bfloat16, 64, "cannot run (wgmma operands in registers, ACC.init): no interpret mode"),
])
def test_what_it_cannot_run_is_refused_in_one_line(impl, dtype, head_dim, message):
  x = jnp.zeros((1, 128, 1, head_dim), dtype)
  with pytest.raises(ValueError) as error:
    forgetting_attention(x, x, x, jnp.zeros((1, 128, 1)), impl=impl, interpret=True)
  assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("impl", ["mosaic_gpu", "mosaic_gpu_fused", "mosaic_gpu_v1"])
def test_the_interpreter_is_refused_where_it_would_hang(monkeypatch, impl):
  """A kernel's three warpgroups run as three XLA computations at once, waiting on each other: on
  a 2-core machine with 1 or 2 host devices the interpreter hangs (measured: the one-kernel
  backward, version 2's forward), with 3 it runs."""
  monkeypatch.setattr(mosaic_gpu.os, "cpu_count", lambda: 2)  # a 2-core machine, whatever this one is
  monkeypatch.setattr(mosaic_gpu.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
  monkeypatch.setattr(jax, "local_device_count", lambda *backend: 2)
  x = jnp.zeros((1, 128, 1, 64), jnp.bfloat16)
  with pytest.raises(ValueError) as error:
    forgetting_attention(x, x, x, jnp.zeros((1, 128, 1)), impl=impl, interpret=True)
  assert "--xla_force_host_platform_device_count=3" in str(error.value) and "\n" not in str(error.value)


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="a GPU is present")
def test_off_gpu_without_interpret_the_error_says_so():
  x = jnp.zeros((1, 128, 1, 64), jnp.bfloat16)
  with pytest.raises(ValueError, match="needs a Hopper GPU; on CPU pass interpret=True"):
    forgetting_attention(x, x, x, jnp.zeros((1, 128, 1)), impl="mosaic_gpu")


def test_the_pruned_bounds_are_the_tiles_the_per_tile_test_skips():
  """Version 2's sweep bounds (_prune_bounds, plain XLA: tested on every leg) skip exactly the tiles
  the forward's per-tile test (_prunable, on numpy arrays here) skips: a prefix of each query
  block's key blocks, a suffix of each key block's query blocks, the diagonal never."""
  from types import SimpleNamespace
  rng = np.random.default_rng(0)
  block, blocks = 64, 8
  c = np.cumsum(np.log(rng.uniform(0.05, 1.0, size=(3, block * blocks))), axis=1).astype(np.float32)
  thr = np.array([-30.0, -120.0, -1e9], np.float32)  # some, many, none pruned
  starts, ends = (np.asarray(x)[:, ::block].astype(int) for x in mosaic_gpu._prune_bounds(
      jnp.asarray(c), jnp.asarray(thr), block))
  side = lambda row, b: SimpleNamespace(hi_ref=c[row, b * block:(b + 1) * block])
  pruned = np.array([[[bool(mosaic_gpu._prunable(side(row, r), side(row, j), thr[row])) for j in range(blocks)]
                      for r in range(blocks)] for row in range(3)])
  for row in range(3):
    for r in range(blocks):
      assert list(pruned[row, r]) == [j < starts[row, r] for j in range(blocks)]
      assert starts[row, r] <= r  # the diagonal tile is kept
    for j in range(blocks):
      assert list(pruned[row, :, j]) == [r >= ends[row, j] for r in range(blocks)]
  assert starts[0].any() and not starts[2].any()


@pytest.mark.parametrize("gates, offset", [((-4.0, -1.0), 5e4), ((-0.03, 0.0), 0.0)])
@pytest.mark.parametrize("key_block", [mosaic_gpu.ANCHOR_BLOCK, mosaic_gpu.WIDE_KEYS])
def test_the_folded_decay_is_the_two_part_difference_split_at_the_anchors(gates, offset, key_block):
  """Version 2's folded decay (Version.folded_decay; plain XLA and float32 arithmetic: tested on
  every leg): gap + e_i - e_j, gap from the high parts at the two blocks' anchors (their middles),
  e from _in_block_decay2 (the rows' in blocks of 64, the keys' in blocks of 64 or of the forward's
  wide key tiles, 128), is (c_i - c_j) log2 e to within a few roundings of the terms' sizes, c
  far from zero included; with c's low part dropped (a float32 c) it is not."""
  from lpcjax.kernels import decay
  rng = np.random.default_rng(0)
  seq_len, row_block = 256, mosaic_gpu.ANCHOR_BLOCK
  assert mosaic_gpu.ANCHOR == row_block // 2
  log_f = rng.uniform(*gates, size=(1, seq_len))
  log_f[:, 0] -= offset
  exact = np.cumsum(log_f, axis=1)[0] * np.log2(np.e)  # float64
  c = decay.cumsum(jnp.asarray(log_f, jnp.float32))

  def folded(c):
    def side(block):  # e, and hi at each position's block's anchor
      e = np.asarray(mosaic_gpu._in_block_decay2(c, block))[0]
      return e, np.asarray(c.hi)[0, block // 2::block][np.arange(seq_len) // block]
    (e_i, anchor_i), (e_j, anchor_j) = side(row_block), side(key_block)
    gap = (anchor_i[:, None] - anchor_j[None, :]) * np.float32(np.log2(np.e))  # float32, as the kernels
    return gap + e_i[:, None] - e_j[None, :], np.abs(gap) + np.abs(e_i[:, None]) + np.abs(e_j[None, :])

  decay2, size = folded(c)
  error = np.abs(decay2 - (exact[:, None] - exact[None, :]))
  assert np.all(error <= 2 ** -21 * size + 1e-6), np.max(error - 2 ** -21 * size)
  dropped, _ = folded(c._replace(lo=jnp.zeros_like(c.lo)))
  assert (np.max(np.abs(dropped - (exact[:, None] - exact[None, :]))) > 1e-3) == (offset > 0)

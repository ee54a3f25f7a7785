"""The context-parallel ring running the GPU kernels' pair kernels (impl="pallas" and
"triton", kernels/gpu_calls.py) against the float64 ground truth (tests/float64_attention.py):
outputs and the four gradients over 2, 4 and 8 devices, with packed documents and sliding
windows that cross shard boundaries, pruning, grouped-query heads, bf16 (the pairs' row term),
and the padded-chunk pruning case.

On CPU the Pallas kernels run interpreted and the Triton kernels under Triton's interpreter
(tests/triton_interpreted.py; skipped without torch and triton). Shapes are tiny, and the
cases are chosen for what they add: a window ring is contiguous (one chunk pair per step, and
only the steps the band reaches), the balanced ring without a window has four pairs a step.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpcjax.kernels import BlockSizes, backends, forgetting_attention, sharded_forgetting_attention, triton_backend
from lpcjax.kernels.pruning import skipped_tile_fraction

from float64_attention import forgetting_attention_float64, relative_errors
from test_context_parallel import mesh_of, ring_value_and_grads
from test_forgetting_attention import INTERPRET, make_inputs, segments_from_starts

SEQ_LEN = 64
EPSILON = 1e-6
TILES = BlockSizes(16, 16)  # the GPU kernels' smallest: chunks of 4 or 8 tokens pad up to it


def backend(name, monkeypatch):
  """``name`` ready to run here, and its interpret flag: the Pallas kernels interpreted off a
  GPU, the Triton kernels under Triton's interpreter off a GPU (skipped without torch, triton)."""
  if name == "triton" and not backends.get("triton").runs_natively():
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    import triton_interpreted
    monkeypatch.setattr(triton_backend, "launcher", triton_interpreted.interpreted_launcher())
  return name, INTERPRET.get(name, False)


def inputs(heads=2, kv_heads=2, dtype=jnp.float32, strong_decay=False):
  """Two sequences whose documents straddle the shard and chunk boundaries of every mesh below
  (multiples of 4); ids increase, as the float64 truth compares them for equality."""
  q, _, _, log_f, do = make_inputs(3, 2, SEQ_LEN, heads, 16, dtype=dtype)
  _, k, v, _, _ = make_inputs(4, 2, SEQ_LEN, kv_heads, 16, dtype=dtype)
  if strong_decay:  # steep enough that pruning skips tiles at epsilon 1e-6
    log_f = 3.0 * log_f
  seg = np.concatenate([segments_from_starts(1, SEQ_LEN, [13, 33, 50]), segments_from_starts(1, SEQ_LEN, [7])])
  return q, k, v, log_f, do, jnp.asarray(seg)


def float64_truth(q, k, v, log_f, do, seg, window):
  """o and the four gradients in float64; grouped k, v repeated per query head, their
  gradients summed back over each group."""
  group = q.shape[2] // k.shape[2]
  up = lambda x: np.asarray(x, np.float64)
  o, dq, dk, dv, dlog_f = forgetting_attention_float64(
      up(q), np.repeat(up(k), group, axis=2), np.repeat(up(v), group, axis=2), up(log_f), up(do), seg, window)
  fold = lambda x: x.reshape(x.shape[:2] + (k.shape[2], group) + x.shape[3:]).sum(axis=3)
  return o, dq, fold(dk), fold(dv), dlog_f


CASES = {  # name: (devices, window, prune, query heads, key/value heads, dtype)
  "2dev_gqa": (2, None, False, 4, 2, jnp.float32),  # balanced: four pairs a step; K, V at 2 heads
  "4dev_window_pruned": (4, 20, True, 2, 2, jnp.float32),  # shard 16 < window: 3 of 4 steps
  "8dev_window_bf16": (8, 11, False, 2, 2, jnp.bfloat16),  # shard 8: the band reaches 2 shards
  # back; bf16 recomputes the row term over one more ring (row_term.py)
  "2dev_window": (2, 24, False, 2, 2, jnp.float32),
  "8dev_pruned": (8, None, True, 2, 2, jnp.float32),  # balanced: 16 chunks of 4, padded to 16
}
# The fast set stays within ~50 s of one core (interpreted compiles dominate: ~0.3 s per
# pallas_call, 24 of them in a balanced ring); the rest, and every Triton case but one (its
# interpreter runs each program in Python), are marked slow.
FAST = {("pallas", case) for case in ("2dev_gqa", "4dev_window_pruned", "8dev_window_bf16")}
FAST |= {("triton", "4dev_window_pruned")}
PARAMS = [pytest.param(name, case, id=f"{name}-{case}", marks=() if (name, case) in FAST else pytest.mark.slow)
          for name in ("pallas", "triton") for case in CASES]


def check_ring(impl, interpret, devices, window, prune, heads, kv_heads, dtype):
  mesh = mesh_of((devices,), ("context",))
  q, k, v, log_f, do, seg = inputs(heads, kv_heads, dtype, strong_decay=prune)
  if prune:  # the inputs make pruning skip tiles, so the pruned path is what is compared
    assert skipped_tile_fraction(q, jnp.repeat(k, heads // kv_heads, axis=2), log_f, block_q=16, block_k=16,
                                 epsilon=EPSILON) > 0
  o, grads = ring_value_and_grads(mesh, None, q, k, v, log_f, do, seg, impl=impl, interpret=interpret,
                                  window=window, block_sizes=TILES, prune_epsilon=EPSILON if prune else None)
  assert o.dtype == dtype and [g.shape for g in grads] == [x.shape for x in (q, k, v, log_f)]
  errors = relative_errors((o,) + tuple(grads), float64_truth(q, k, v, log_f, do, seg, window))
  # float32: pruning moves outputs by < 2 epsilon max|v| (pruning.py); bf16: the single-device
  # bounds of test_forgetting_attention's bf16 tests (o, dq, dk, dv; d log f to 1e-4), here
  # against float64 of the rounded inputs
  bounds = (3e-5,) * 5 if dtype == jnp.float32 else (2e-2, 0.03, 0.03, 0.03, 1e-4)
  assert all(e <= b for e, b in zip(errors, bounds)), dict(zip(("o", "dq", "dk", "dv", "dlog_f"), errors))


@pytest.mark.parametrize("name,case", PARAMS)
def test_ring_of_gpu_kernels_matches_float64(name, case, monkeypatch):
  check_ring(*backend(name, monkeypatch), *CASES[case])


@pytest.mark.parametrize("name", ["pallas", pytest.param("triton", marks=pytest.mark.slow)])
def test_padded_chunks_keep_pruning(name, monkeypatch):
  """T = 96 over 4 devices: 8 chunks of 12 padded to tiles of 16. NaN in v[0:8] reaches only
  the rows whose tiles with keys 0..15 pruning does not skip: the GPU kernels' pairs skip them
  too (the padded c is the chunk's last, so padding never stops a skip), so from row 48 on the
  ring is finite and equals one device."""
  name, interpret = backend(name, monkeypatch)
  mesh = mesh_of((4,), ("context",))
  q, k, v, log_f, _ = make_inputs(5, 1, 96, 2, 16)
  log_f = 6.0 * log_f - 1.0  # steep: tiles a chunk or more below their keys are skipped
  v = v.at[:, :8].set(jnp.nan)
  options = dict(block_sizes=TILES, prune_epsilon=EPSILON)
  one_device = jax.jit(lambda *x: forgetting_attention(*x, impl="xla", **options))(q, k, v, log_f)
  ring = jax.jit(lambda *x: sharded_forgetting_attention(*x, mesh=mesh, context_axis="context", impl=name,
                                                         interpret=interpret, **options))(q, k, v, log_f)
  assert bool(jnp.all(jnp.isfinite(one_device[:, 48:])))
  assert bool(jnp.all(jnp.isfinite(ring[:, 48:])))
  np.testing.assert_allclose(ring[:, 48:], one_device[:, 48:], atol=1e-5, rtol=1e-5)

"""Grouped-query attention (kernels/gqa.py): k, v with fewer heads than q.

The independent check is the float64 product form (test_forgetting_attention.py) on K/V
repeated to every query head with ``jnp.repeat``, and autodiff of the reference on those
repeated inputs, whose dK/dV are then summed over each group. Every backend that runs here is
compared with the grouped reference at HQ/H = 2, 4, 8, outputs and the four gradients; HQ/H = 1
is the shared suite (test_forgetting_attention.py), which runs the same code with G = 1.
The grouped cases keep two key/value heads where G < 8, so that a wrong head mapping shows.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from lpcjax.kernels import Backend, BlockSizes, forgetting_attention, resolve, unsupported
from lpcjax.kernels.gqa import group_size

from test_forgetting_attention import (BACKENDS, WITH_TPU, make_inputs, numpy_forgetting_attention,
                                       segments_from_starts, value_and_grads)


def grouped_inputs(seed, seq_len, q_heads, kv_heads, head_dim=16, dtype=jnp.float32):
  """q, log f, dO at q_heads; k, v at kv_heads (the first kv_heads of the drawn heads)."""
  q, k, v, log_f, do = make_inputs(seed, 1, seq_len, q_heads, head_dim, dtype=dtype)
  return q, k[:, :, :kv_heads], v[:, :, :kv_heads], log_f, do


def repeated(x, group):
  return jnp.repeat(x, group, axis=2)


def summed(dx, group):
  """Per-query-head gradients of repeated K/V back to the shared heads."""
  b, t, hq, d = dx.shape
  return dx.reshape(b, t, hq // group, group, d).sum(axis=3)


@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=lambda h: f"G{8 // h}")
def test_reference_equals_repeated_kv(kv_heads):
  group = 8 // kv_heads
  q, k, v, log_f, do = grouped_inputs(0, 13, 8, kv_heads, head_dim=8)
  seg = segments_from_starts(1, 13, [6])
  o, g = value_and_grads("reference", q, k, v, log_f, do, segment_ids=seg)
  np.testing.assert_allclose(o, numpy_forgetting_attention(q, repeated(k, group), repeated(v, group), log_f, seg),
                             atol=2e-6)
  o_rep, g_rep = value_and_grads("reference", q, repeated(k, group), repeated(v, group), log_f, do,
                                 segment_ids=seg)
  expected = (g_rep[0], summed(g_rep[1], group), summed(g_rep[2], group), g_rep[3])
  for name, a, b in zip(("dq", "dk", "dv", "dlog_fgate"), g, expected):
    assert a.shape == b.shape, name
    np.testing.assert_allclose(a, b, atol=2e-6, rtol=1e-5, err_msg=name)


# (q heads, kv heads, seq_len, window, prune_epsilon, segment starts, block sizes): ragged lengths
# (not a multiple of a tile), segments, a window and pruning, at HQ/H = 1, 2, 4, 8.
CASES = {
    "G2-T45-segments": (4, 2, 45, None, None, [20], BlockSizes(block_q=16, block_k=32)),
    "G4-T70-window": (8, 2, 70, 21, None, [9, 50], BlockSizes(block_q=32, block_k=16)),
    "G8-T33-pruned": (8, 1, 33, None, 1e-6, [], BlockSizes(16, 16)),
}
# Interpreted, the TPU kernel compiles for tens of seconds per case on 2 cores: it runs one.
TPU_CASES = ("G2-T45-segments",)


@pytest.mark.parametrize("impl,case", [(impl, case) for impl in BACKENDS for case in CASES]
                         + [(impl, case) for impl in WITH_TPU if impl not in BACKENDS for case in TPU_CASES])
def test_backend_gqa_matches_reference(impl, case):
  q_heads, kv_heads, seq_len, window, prune, starts, sizes = CASES[case]
  q, k, v, log_f, do = grouped_inputs(seq_len, seq_len, q_heads, kv_heads)
  seg = segments_from_starts(1, seq_len, starts) if starts else None
  o_ref, g_ref = value_and_grads("reference", q, k, v, log_f, do, segment_ids=seg, window=window)
  o, g = value_and_grads(impl, q, k, v, log_f, do, segment_ids=seg, window=window, block_sizes=sizes,
                         prune_epsilon=prune)
  np.testing.assert_allclose(o, o_ref, atol=1e-5, rtol=1e-5)
  for name, a, b in zip(("dq", "dk", "dv", "dlog_fgate"), g, g_ref):
    assert a.shape == b.shape and a.dtype == b.dtype, name
    np.testing.assert_allclose(a, b, atol=5e-5, rtol=1e-4, err_msg=name)


def test_bad_head_counts_are_one_line_errors():
  q, k, v, log_f, _ = grouped_inputs(0, 8, 4, 4)
  with pytest.raises(ValueError, match="q has 4 heads and k, v 3; grouped-query attention needs"):
    forgetting_attention(q, k[:, :, :3], v[:, :, :3], log_f)
  with pytest.raises(ValueError, match="v shape"):
    forgetting_attention(q, k[:, :, :2], v, log_f)
  assert group_size(8, 2) == 4
  # A backend declaring no GQA refuses a grouped call in one line, through the table.
  plain = Backend("plain", lambda *a, **kw: None, gqa=False)
  assert plain.unsupported(kv_group=2) == "impl='plain' has no grouped-query attention (num_kv_heads < num_heads)"
  assert plain.unsupported(kv_group=1) is None
  for name in ("reference", "xla", "pallas", "pallas_tpu", "triton"):
    assert unsupported(name, kv_group=4) is None, name
  assert resolve("auto", 16, kv_group=4).gqa


@pytest.mark.parametrize("impl", BACKENDS)
def test_bfloat16_gqa_within_documented_tolerance(impl):
  """bf16: the per-query-head dK/dV shares are summed in float32 before the one rounding."""
  q, k, v, log_f, do = grouped_inputs(3, 40, 4, 1, dtype=jnp.bfloat16)
  up = lambda x: x.astype(jnp.float32)
  _, g_ref = value_and_grads("reference", up(q), up(k), up(v), log_f, up(do))
  _, g = value_and_grads(impl, q, k, v, log_f, do, block_sizes=BlockSizes(16, 16))
  for name, a, b, bound in zip(("dq", "dk", "dv", "dlog_fgate"), g, g_ref, (0.03, 0.03, 0.03, 1e-4)):
    assert a.dtype == (jnp.float32 if name == "dlog_fgate" else jnp.bfloat16)
    assert float(jnp.max(jnp.abs(up(a) - b))) <= bound * float(jnp.max(jnp.abs(b))), name

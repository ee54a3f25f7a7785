"""Long-context precision: every backend against an independent float64 computation
(float64_attention.py), outputs and the four gradients within 1e-4 relative in float32, where
|c| = |cumsum log f| is large: strong gates (log f in [-4, -1] per step) at T = 16k, and c
offset by 5e4 (which changes no weight) at T = 1024. A float32 c = cumsum(log f) missed this
by ~1e-3 (decay.COMPENSATED = False, checked below); kernels/decay.py says why and what holds
instead."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpcjax.kernels import BlockSizes, decay, forgetting_attention

from float64_attention import forgetting_attention_float64, long_context_inputs, relative_errors

TOLERANCE = 1e-4
INTERPRET = {"pallas": jax.default_backend() != "gpu", "pallas_tpu": jax.default_backend() != "tpu"}


def float32_results(impl, q, k, v, log_f, do, **options):
  """o and the four gradients of sum(o * do) from one backend."""
  def loss(q, k, v, log_f):
    o = forgetting_attention(q, k, v, log_f, impl=impl, interpret=INTERPRET.get(impl, False), **options)
    return jnp.sum(o * do), o
  (_, o), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))(q, k, v, log_f)
  return (o,) + tuple(grads)


@pytest.fixture(scope="module")
def offset_case():
  """T = 1024, log f in [-4, -1], c offset by 5e4: |c| ~ 5e4 from the first position on."""
  inputs = long_context_inputs(0, 1, 1024, 2, 16, c_offset=5e4)
  return inputs, forgetting_attention_float64(*inputs)


@pytest.fixture(scope="module")
def long_case():
  """T = 16384, log f in [-4, -1]: |c| reaches ~4e4 by the end."""
  inputs = long_context_inputs(1, 1, 16384, 1, 16)
  return inputs, forgetting_attention_float64(*inputs)


def test_two_float_cumsum_is_exact():
  """hi + lo equals numpy's float64 cumsum to ~1e-9 at |c| ~ 1e5 (the float32 cumsum is off by
  ~0.5), hi is it rounded to float32, both directions, gates and mixed signs (dc)."""
  rng = np.random.default_rng(0)
  gates = rng.uniform(-4, -1, size=(2, 16384, 3)).astype(np.float32)
  gates[:, 0] -= 5e4
  mixed = rng.normal(size=(2, 16384, 3)).astype(np.float32) * 100
  for x in (gates, mixed):
    for reverse in (False, True):
      c = jax.jit(lambda x: decay.cumsum(x, axis=1, reverse=reverse))(x)
      x64 = x.astype(np.float64)
      exact = np.cumsum(x64[:, ::-1], axis=1)[:, ::-1] if reverse else np.cumsum(x64, axis=1)
      np.testing.assert_allclose(np.float64(c.hi) + np.float64(c.lo), exact, rtol=0, atol=1e-8)
      np.testing.assert_array_equal(c.hi, exact.astype(np.float32))


def test_two_float_difference_scales_with_the_decay():
  """c_i - c_j from the two parts is within 2u |c_i - c_j| (+ a few u ulp(c)) of the float64
  difference, where the float32 difference of float32 c's is ~ulp(|c|) off."""
  rng = np.random.default_rng(1)
  log_f = rng.uniform(-4, -1, size=(4096,)).astype(np.float32)
  log_f[0] -= 5e4
  c = decay.cumsum(jnp.asarray(log_f))
  exact = np.cumsum(np.float64(log_f))
  i, j = rng.integers(0, 4096, size=(2, 2000))
  got = np.float64(decay.difference(decay.tree_map(lambda x: x[i], c), decay.tree_map(lambda x: x[j], c)))
  want = exact[i] - exact[j]
  assert np.all(np.abs(got - want) <= 2 * 2.0**-24 * np.abs(want) + 1e-9)


@pytest.mark.parametrize("impl", ["reference", "xla", "pallas", "pallas_tpu"])
def test_backend_with_c_offset_matches_float64(impl, offset_case):
  inputs, truth = offset_case
  sizes = BlockSizes(64, 32)
  if impl == "pallas_tpu":  # its interpreted grid steps are slow: half the sequence, wide tiles
    inputs = [x[:, :512] for x in inputs]
    truth, sizes = forgetting_attention_float64(*inputs), BlockSizes(256, 256)
  errors = relative_errors(float32_results(impl, *inputs, block_sizes=sizes), truth)
  assert max(errors) <= TOLERANCE, dict(zip(("o", "dq", "dk", "dv", "dlog_f"), errors))


def test_plain_float32_cumsum_misses_the_bound(offset_case, monkeypatch):
  """The same check fails with c a float32 cumsum (the code before decay.py): the test can see
  the error it guards against."""
  monkeypatch.setattr(decay, "COMPENSATED", False)
  (q, k, v, log_f, do), truth = offset_case
  errors = relative_errors(float32_results("xla", q, k, v, log_f, do), truth)
  assert min(errors) > 3 * TOLERANCE, errors


@pytest.mark.parametrize("impl", ["xla", pytest.param("reference", marks=pytest.mark.slow)])
def test_backend_at_16k_matches_float64(impl, long_case):
  """The reference materializes [T, T] (~6 GB, ~40 s on 2 cores at 16k): marked slow."""
  (q, k, v, log_f, do), truth = long_case
  errors = relative_errors(float32_results(impl, q, k, v, log_f, do, block_sizes=BlockSizes(256, 256)), truth)
  assert max(errors) <= TOLERANCE, dict(zip(("o", "dq", "dk", "dv", "dlog_f"), errors))

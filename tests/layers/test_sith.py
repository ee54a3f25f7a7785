import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpcjax.layers.sith import TABLE_C, SITHCompressor, sith_filters, sith_peaks


def test_table_c_gives_the_papers_windows():
  assert round(sith_peaks(53, TABLE_C)[-1]) == 8192
  assert [round(sith_peaks(n, TABLE_C)[-1]) for n in (5, 9, 13, 21)] == [2, 4, 8, 32]


def test_filters_match_an_independent_float64_evaluation():
  k, taus = 200, sith_peaks(21, TABLE_C)
  filters = sith_filters(21, k, TABLE_C)
  assert filters.shape == (21, 32) and filters.dtype == np.float32
  for i in (0, 10, 20):
    for t in (1, 5, 17, 32):
      # Independent route: Stirling-free product form, k^(k+1)/k! = exp(sum over j of log(k / j)) * k.
      log_prefactor = math.log(k) + sum(math.log(k / j) for j in range(1, k + 1))
      expected = math.exp(log_prefactor + k * math.log(t / taus[i]) - k * t / taus[i])
      assert filters[i, t - 1] == pytest.approx(expected, rel=1e-6, abs=1e-30)


def test_peaks_at_tau_and_constant_relative_width():
  filters = sith_filters(29, 100, TABLE_C, horizon=2000).astype(np.float64)
  taus = sith_peaks(29, TABLE_C)
  t = np.arange(1, 2001)
  for i in range(5, 29):  # rows whose peak is well inside the horizon
    assert abs(t[np.argmax(filters[i])] - taus[i]) <= 1
  mean = (filters * t).sum(1) / filters.sum(1)
  std = np.sqrt((filters * t**2).sum(1) / filters.sum(1) - mean**2)
  cv = (std / mean)[12:28]
  assert cv.max() - cv.min() < 0.01 * cv.mean()  # widths grow in proportion to tau
  np.testing.assert_allclose(taus[1:] / taus[:-1], 1 + TABLE_C)


def test_compressor_equals_a_causal_depthwise_convolution_at_the_chunk_start():
  filters = sith_filters(9, 50, TABLE_C)  # M = 4
  rng = np.random.default_rng(0)
  history = rng.normal(size=(2, filters.shape[1], 3)).astype(np.float32)
  compressor = SITHCompressor(num_filters=9, k=50)
  params = compressor.init(jax.random.PRNGKey(0), jnp.asarray(history))
  slots = compressor.apply(params, jnp.asarray(history))
  # Direct convolution of the whole signal, sampled at t = M (the chunk start).
  horizon = filters.shape[1]
  conv = np.zeros((2, 9, 3))
  for i in range(9):
    for tp in range(1, horizon + 1):
      conv[:, i] += filters[i, tp - 1] * history[:, horizon - tp]
  normed = (conv - conv.mean(-1, keepdims=True)) / np.sqrt(conv.var(-1, keepdims=True) + 1e-6)
  np.testing.assert_allclose(slots, normed, atol=1e-4)


def test_delta_pulse_control_keeps_the_last_tokens():
  history = jnp.asarray(np.random.default_rng(1).normal(size=(1, 40, 4)), jnp.float32)
  compressor = SITHCompressor(num_filters=5, k=100, delta_pulse=True)
  params = compressor.init(jax.random.PRNGKey(0), history)
  slots = compressor.apply(params, history)
  last = np.asarray(history[:, -5:])
  normed = (last - last.mean(-1, keepdims=True)) / np.sqrt(last.var(-1, keepdims=True) + 1e-6)
  np.testing.assert_allclose(slots, normed, atol=1e-5)

"""PMT's contrastive losses against direct loop implementations, on tiny batches with a padding
example; the family loss on missing values."""

import math

import jax
import jax.numpy as jnp
import numpy as np

from lpcjax.models import PMT, PMTConfig
from lpcjax.models.pmt_losses import (hgcl_token_level, hgcl_window_level, icl_loss, pcl_direction, pmt_loss,
                                      sample_other)

RNG = np.random.default_rng(0)


def unit(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def soft_nll(s_pos, soft, s_negs, tau):
  pos = math.exp(s_pos / tau) + math.exp(soft / tau)
  return -math.log(pos / (pos + sum(math.exp(s / tau) for s in s_negs)))


def test_icl_equals_a_loop():
  z1, z2 = unit(RNG.normal(size=(5, 6))), unit(RNG.normal(size=(5, 6)))
  valid = np.array([1, 1, 1, 0, 1], bool)  # example 3 is evaluation padding
  total, count = icl_loss(jnp.asarray(z1), jnp.asarray(z2), 0.6, jnp.asarray(valid))
  expected = []
  for i in np.flatnonzero(valid):
    for a, b in ((z1, z2), (z2, z1)):
      logits = [a[i] @ b[j] / 0.6 for j in np.flatnonzero(valid)]
      expected.append(0.5 * (math.log(sum(map(math.exp, logits))) - a[i] @ b[i] / 0.6))
  assert count == 4
  np.testing.assert_allclose(total, sum(expected), rtol=1e-5)


def test_hgcl_token_level_equals_a_loop():
  batch, k, d, window, stride, negs, sigma, tau = 3, 9, 4, 4, 2, 5, 1.5, 0.5
  n = (k - window) // stride + 1
  t_a, t_b = unit(RNG.normal(size=(batch, k, d))), unit(RNG.normal(size=(batch, k, d)))
  token_valid = np.ones((batch, k), bool)
  token_valid[1, 7:] = False
  example_valid = np.array([1, 1, 0], bool)
  neg_seq = (np.arange(batch)[:, None, None] + RNG.integers(1, batch, (batch, n, negs))) % batch
  neg_pos = RNG.integers(0, k, (batch, n, negs))
  total, count = hgcl_token_level(jnp.asarray(t_a), jnp.asarray(t_b), jnp.asarray(token_valid),
                                  jnp.asarray(example_valid), (window, stride, n), sigma, tau,
                                  (jnp.asarray(neg_seq), jnp.asarray(neg_pos)))
  losses = []
  for i in range(batch):
    for w in range(n):
      for a in range(window):
        p = w * stride + a
        if not (example_valid[i] and token_valid[i, p]):
          continue
        s_pos = t_a[i, p] @ t_b[i, p]
        soft = sum(math.exp(-(a - c) ** 2 / (2 * sigma**2)) * (t_a[i, p] @ t_b[i, w * stride + c])
                   for c in range(window) if c != a and token_valid[i, w * stride + c])
        s_negs = [t_a[i, p] @ t_b[j, q] for j, q in zip(neg_seq[i, w], neg_pos[i, w])
                  if example_valid[j] and token_valid[j, q]]
        losses.append(soft_nll(s_pos, soft, s_negs, tau))
  assert count == len(losses)
  np.testing.assert_allclose(total, sum(losses), rtol=1e-5)


def test_hgcl_window_level_equals_a_loop():
  batch, k, d, window, stride, sigma, tau = 3, 10, 4, 4, 2, 1.0, 0.5
  n = (k - window) // stride + 1
  t_a, t_b = unit(RNG.normal(size=(batch, k, d))), unit(RNG.normal(size=(batch, k, d)))
  token_valid = np.ones((batch, k), bool)
  token_valid[2, 6:] = False  # windows 3 of series 2 is empty
  example_valid = np.array([1, 0, 1], bool)
  total, count = hgcl_window_level(jnp.asarray(t_a), jnp.asarray(t_b), jnp.asarray(token_valid),
                                   jnp.asarray(example_valid), (window, stride, n), sigma, tau)

  def window_repr(t, i, w):
    rows = [t[i, w * stride + c] for c in range(window) if token_valid[i, w * stride + c]]
    return unit(np.mean(rows, 0)) if rows else None

  losses = []
  for i in range(batch):
    for u in range(n):
      r = window_repr(t_a, i, u)
      if not example_valid[i] or r is None:
        continue
      s_pos = r @ window_repr(t_b, i, u)
      soft = sum(math.exp(-(u - v) ** 2 / (2 * sigma**2)) * (r @ window_repr(t_b, i, v))
                 for v in range(n) if v != u and window_repr(t_b, i, v) is not None)
      s_negs = [r @ window_repr(t_b, j, v) for j in range(batch) if j != i and example_valid[j]
                for v in range(n) if window_repr(t_b, j, v) is not None]
      losses.append(soft_nll(s_pos, soft, s_negs, tau))
  assert count == len(losses)
  np.testing.assert_allclose(total, sum(losses), rtol=1e-5)


def test_pcl_equals_a_loop_and_stops_the_key_gradient():
  batch, n, slots, p, negs, tau = 3, 2, 2, 4, 6, 0.9
  z_a, z_b = unit(RNG.normal(size=(batch, n, slots, p))), unit(RNG.normal(size=(batch, n, slots, p)))
  state_valid = np.ones((batch, n), bool)
  state_valid[0, 1] = False
  example_valid = np.array([1, 1, 1], bool)
  negatives = ((np.arange(batch)[:, None] + RNG.integers(1, batch, (batch, negs))) % batch,
               RNG.integers(0, n, (batch, negs)), RNG.integers(0, slots, (batch, negs)))
  args = (jnp.asarray(state_valid), jnp.asarray(example_valid), tau, tuple(map(jnp.asarray, negatives)))
  total, count = pcl_direction(jnp.asarray(z_a), jnp.asarray(z_b), *args)
  losses = []
  for i in range(batch):
    for w in range(n):
      for m in range(slots):
        if not state_valid[i, w]:
          continue
        logits = [z_a[i, w, m] @ z_b[i, w, m] / tau] + [
            z_a[i, w, m] @ z_b[j, v, s] / tau for j, v, s in zip(*(a[i] for a in negatives)) if state_valid[j, v]]
        losses.append(math.log(sum(map(math.exp, logits))) - logits[0])
  assert count == len(losses)
  np.testing.assert_allclose(total, sum(losses), rtol=1e-5)
  key_grad = jax.grad(lambda zb: pcl_direction(jnp.asarray(z_a), zb, *args)[0])(jnp.asarray(z_b))
  assert not np.asarray(key_grad).any()


def test_family_loss_is_finite_with_missing_values_and_weights_switch_losses_off():
  config = PMTConfig(d_model=16, num_heads=2, num_blocks=1, tokenizer_kernels=8, projection_dim=16, patch_size=4,
                     patch_stride=2, pcl_weight=0.0)
  x = RNG.normal(size=(4, 40, 1)).astype(np.float32)
  x[1, 20:] = np.nan  # a short series: its later windows are empty
  x[2, ::3] = np.nan
  model = PMT(config)
  variables = jax.jit(model.init)(jax.random.PRNGKey(0), x[:1])
  mutable = {"batch_stats": variables["batch_stats"]}

  def loss(params):
    value, metrics, new_mutable = pmt_loss(model.apply, params, {"x": jnp.asarray(x)}, rng=jax.random.PRNGKey(1),
                                           step=0, mutable=mutable, train=True)
    return value, (metrics, new_mutable)

  (value, (metrics, new_mutable)), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(variables["params"])
  assert np.isfinite(value) and all(np.isfinite(g).all() for g in jax.tree.leaves(grads))
  assert set(metrics) == {"loss", "icl", "hgcl"}  # λ_PCL = 0: not computed
  icl, hgcl = (metrics[name][0] / metrics[name][1] for name in ("icl", "hgcl"))
  np.testing.assert_allclose(value, icl + hgcl, rtol=1e-5)
  assert not np.allclose(new_mutable["batch_stats"]["tokenizer"]["BatchNorm_0"]["mean"], 0)


def test_negatives_are_other_valid_sequences():
  valid = jnp.asarray([True, True, False, True, True])
  draws = np.asarray(sample_other(jax.random.PRNGKey(0), valid, (5, 400)))
  for row in range(5):
    assert set(draws[row]) == {0, 1, 3, 4} - {row}


def test_evaluation_loss_ignores_padding_examples():
  """train=False with a padding example (valid = 0): every term finite, weights count the valid
  series, and the padding row's content does not change the loss."""
  config = PMTConfig(d_model=16, num_heads=2, num_blocks=1, tokenizer_kernels=8, projection_dim=16, patch_size=4,
                     patch_stride=2, pcl_negatives=16, hgcl_negatives=8)
  x = RNG.normal(size=(4, 40, 1)).astype(np.float32)
  model = PMT(config)
  variables = jax.jit(model.init)(jax.random.PRNGKey(0), x[:1])
  mutable = {"batch_stats": variables["batch_stats"]}
  valid = jnp.asarray([1., 1., 1., 0.])
  evaluate = jax.jit(lambda x: pmt_loss(model.apply, variables["params"], {"x": x, "valid": valid},
                                        rng=jax.random.PRNGKey(2), step=0, mutable=mutable, train=False))
  value, metrics, _ = evaluate(jnp.asarray(x))
  other_padding = x.copy()
  other_padding[3] = 100.0
  value2, _, _ = evaluate(jnp.asarray(other_padding))
  assert set(metrics) == {"loss", "icl", "hgcl", "pcl"} and np.isfinite(value)
  assert all(float(weight) == 3.0 for _, weight in metrics.values())
  np.testing.assert_allclose(value2, value, rtol=1e-5)

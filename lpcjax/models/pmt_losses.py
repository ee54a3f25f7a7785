"""PMT pre-training: two augmented views of each series (jitter, scaling, masking: ``augment``),
and the three contrastive losses of the PMT spec §7, L = λ_ICL ICL + λ_HGCL HGCL + λ_PCL PCL
(λ = 0 switches a loss off).

Negatives come from the other sequences of the global batch (the loss runs under jit on the
whole sharded batch). Evaluation batches mark padding examples with ``valid`` = 0: they are
neither anchors nor negatives. Each loss is a metric; every metric is weighed by the number of
(valid) series, so means over micro-batches and evaluation batches are exact. Contrastive losses
depend on the batch they see: gradient accumulation changes the negatives, not just the noise.

* ICL (§7.1): symmetric InfoNCE between the two views' [CLS] projections.
* HGCL (§7.2): the paper's per-anchor formula was not recovered. Implemented: the
  reconstruction of the PMT spec §7.2 (it has every property the paper states),
  ℓ_a = −log[(e^{s_ap/τ} + e^{(T_a − s_ap)/τ}) / (e^{s_ap/τ} + e^{(T_a − s_ap)/τ} + Σ_n e^{s_an/τ})],
  T_a = Σ_c q_ac s_ac over the local candidates c with unnormalized Gaussian weights (q_ap = 1),
  at two levels, averaged: tokens (candidates: the W tokens of the anchor's window in the other
  view, weights in token offset; negatives: ``hgcl_negatives`` tokens of other sequences,
  sampled per window and shared by its anchors, which keeps memory at O(N · negatives · d)), and
  windows (a window = the ℓ2-normalized mean of its tokens; candidates: the windows of the same
  sequence, weights in window index; negatives: every window of the other sequences). Both
  directions (view 1 → 2 and 2 → 1) are averaged. Representations: the encoder's token outputs,
  ℓ2-normalized, without a projection head.
* PCL (§7.3): the last block's memories through one projection head per slot; anchor (i, w, m)
  in one view, positive the same state in the other view (stop-gradient keys), ``pcl_negatives``
  states sampled uniformly from other sequences of the other view (per sequence, shared by its
  windows and slots); sampled InfoNCE, both directions averaged.
"""

import jax
import jax.numpy as jnp
import numpy as np

from lpcjax.layers.pma import masked_mean, window_tokens

_MASKED = -1e30


def augment(x, rng, noise, scale, mask):
  """One view of x [batch, T, C]: each series' channels scaled by 1 + N(0, scale²), plus i.i.d.
  N(0, noise²) jitter, then a ``mask`` fraction of the samples set to 0 (the mean, after the
  per-channel standardization). Masked samples stay valid tokens' samples, so the two views keep
  the same token grid (HGCL and PCL pair positions across views); missing samples stay NaN."""
  scale_rng, noise_rng, mask_rng = jax.random.split(rng, 3)
  view = x  # each part drawn only when asked for (the settings are static: no draws in the step)
  if scale:
    view = view * (1.0 + scale * jax.random.normal(scale_rng, (x.shape[0], 1, x.shape[2]), x.dtype))
  if noise:
    view = view + noise * jax.random.normal(noise_rng, x.shape, x.dtype)
  if mask:
    view = jnp.where(jax.random.uniform(mask_rng, x.shape) < mask, jnp.where(jnp.isnan(x), x, 0.0), view)
  return view


def make_views(x, rng, noise, scale=(0.0, 0.0), mask=(0.0, 0.0)):
  """Two views of x [batch, T, C] (``augment`` with the first and second entry of each)."""
  first, second = jax.random.split(rng)
  return (augment(x, first, noise[0], scale[0], mask[0]), augment(x, second, noise[1], scale[1], mask[1]))


def normalize(x):
  """x / |x| over the last axis; a zero vector stays zero (and has finite gradients)."""
  return x * jax.lax.rsqrt(jnp.maximum((x * x).sum(-1, keepdims=True), 1e-12))


def weighted_mean(values, weights):
  """(sum, count) of ``values`` over the anchors where ``weights`` (same shape) is set."""
  weights = weights.astype(jnp.float32)
  return (values * weights).sum(), weights.sum()


# ----------------------------------------------------------------------------- ICL


def icl_loss(z1, z2, temperature, example_valid):
  """Symmetric InfoNCE of the [CLS] projections z [batch, p] (ℓ2-normalized): the positive of
  series i in view 1 is series i in view 2. Returns (sum over anchors, number of anchors)."""
  logits = z1 @ z2.T / temperature
  logits = jnp.where(example_valid[None, :] & example_valid[:, None], logits, _MASKED)
  positive = jnp.diagonal(logits)
  forward = jax.nn.logsumexp(logits, axis=1) - positive
  backward = jax.nn.logsumexp(logits, axis=0) - positive
  return weighted_mean(0.5 * (forward + backward), example_valid)


# ----------------------------------------------------------------------------- HGCL


def gaussian_weights(size, sigma):
  """q [size, size] = exp(−(i − j)² / 2σ²): unnormalized, 1 on the diagonal."""
  offset = np.arange(size)[:, None] - np.arange(size)[None]
  return jnp.asarray(np.exp(-offset.astype(np.float64) ** 2 / (2 * sigma**2)), jnp.float32)


def soft_positive_nll(s_pos, soft, s_neg, neg_valid, temperature):
  """−log[(e^{s_p/τ} + e^{soft/τ}) / (e^{s_p/τ} + e^{soft/τ} + Σ_n e^{s_n/τ})] per anchor."""
  positive = jnp.logaddexp(s_pos / temperature, soft / temperature)
  negative = jax.nn.logsumexp(jnp.where(neg_valid, s_neg / temperature, _MASKED), axis=-1)
  return jnp.logaddexp(positive, negative) - positive


def hgcl_token_level(t_a, t_b, token_valid, example_valid, geometry, sigma, temperature, negatives):
  """One direction of the token level. t_a, t_b [batch, K, d] ℓ2-normalized tokens of the two
  views; geometry = (W, S, N); negatives = (sequence, position) int arrays [batch, N, n_neg]:
  the tokens of view b that are the negatives of window (i, w)."""
  window, stride, n = geometry
  anchors = window_tokens(t_a, window, stride, n)  # [batch, N, W, d]
  candidates = window_tokens(t_b, window, stride, n)
  valid = window_tokens(token_valid, window, stride, n) & example_valid[:, None, None]
  sims = jnp.einsum("bnkd,bncd->bnkc", anchors, candidates)
  s_pos = jnp.diagonal(sims, axis1=-2, axis2=-1)
  soft = (sims * gaussian_weights(window, sigma) * valid[:, :, None, :]).sum(-1) - s_pos
  neg_seq, neg_pos = negatives
  s_neg = jnp.einsum("bnkd,bnjd->bnkj", anchors, t_b[neg_seq, neg_pos])
  neg_valid = (token_valid[neg_seq, neg_pos] & example_valid[neg_seq])[:, :, None, :]
  return weighted_mean(soft_positive_nll(s_pos, soft, s_neg, neg_valid, temperature), valid)


def hgcl_window_level(t_a, t_b, token_valid, example_valid, geometry, sigma, temperature):
  """One direction of the window level: windows = ℓ2-normalized masked means of their tokens."""
  window, stride, n = geometry
  valid_tokens = window_tokens(token_valid, window, stride, n)
  r_a = normalize(masked_mean(window_tokens(t_a, window, stride, n), valid_tokens, -2))  # [batch, N, d]
  r_b = normalize(masked_mean(window_tokens(t_b, window, stride, n), valid_tokens, -2))
  valid = valid_tokens.any(-1) & example_valid[:, None]
  sims = jnp.einsum("bud,bvd->buv", r_a, r_b)
  s_pos = jnp.diagonal(sims, axis1=-2, axis2=-1)
  soft = (sims * gaussian_weights(n, sigma) * valid[:, None, :]).sum(-1) - s_pos
  batch = t_a.shape[0]
  s_neg = jnp.einsum("bud,cvd->bucv", r_a, r_b).reshape(batch, n, batch * n)
  other = ~np.eye(batch, dtype=bool)[:, None, :, None]
  neg_valid = (other & valid[None, None]).reshape(batch, 1, batch * n)
  return weighted_mean(soft_positive_nll(s_pos, soft, s_neg, neg_valid, temperature), valid)


def sample_other(rng, example_valid, shape):
  """Indices [batch, ...] of valid sequences other than the row's own, uniform (evaluation
  padding is never drawn; a row with no valid other sequence draws masked ones)."""
  batch = example_valid.shape[0]
  others = ~np.eye(batch, dtype=bool) if batch > 1 else np.ones((1, 1), bool)
  allowed = example_valid[None, :] & others
  allowed = jnp.where(allowed.any(-1, keepdims=True), allowed, others)
  logits = jnp.where(allowed, 0.0, -jnp.inf)  # [batch, batch]
  draws = jax.random.categorical(rng, logits[:, None, :], axis=-1, shape=(batch, int(np.prod(shape[1:]))))
  return draws.reshape(shape)


def hgcl_loss(t1, t2, token_valid, example_valid, geometry, config, rng):
  """½ (token level + window level), each the mean over its anchors of both directions."""
  batch, k, _ = t1.shape
  shape = (batch, geometry[2], config.hgcl_negatives)
  seq_rng, pos_rng = jax.random.split(rng)
  negatives = (sample_other(seq_rng, example_valid, shape), jax.random.randint(pos_rng, shape, 0, k))
  t1, t2 = normalize(t1), normalize(t2)
  levels = {}
  for name, level in (("token", lambda a, b: hgcl_token_level(a, b, token_valid, example_valid, geometry,
                                                              config.hgcl_token_sigma, config.hgcl_temperature,
                                                              negatives)),
                      ("window", lambda a, b: hgcl_window_level(a, b, token_valid, example_valid, geometry,
                                                                config.hgcl_window_sigma, config.hgcl_temperature))):
    (sum_ab, count), (sum_ba, _) = level(t1, t2), level(t2, t1)
    levels[name] = 0.5 * (sum_ab + sum_ba) / jnp.maximum(count, 1.0)
  return 0.5 * (levels["token"] + levels["window"])


# ----------------------------------------------------------------------------- PCL


def pcl_direction(z_a, z_b, state_valid, example_valid, temperature, negatives):
  """Anchors z_a [batch, N, n_m, p] against stop-gradient keys z_b; negatives = (sequence,
  window, slot) int arrays [batch, n_neg] of view b."""
  keys = jax.lax.stop_gradient(z_b)
  s_pos = (z_a * keys).sum(-1)
  neg_seq, neg_window, neg_slot = negatives
  s_neg = jnp.einsum("bwmp,bjp->bwmj", z_a, keys[neg_seq, neg_window, neg_slot])
  neg_valid = (state_valid[neg_seq, neg_window] & example_valid[neg_seq])[:, None, None, :]
  logits = jnp.concatenate([s_pos[..., None], jnp.where(neg_valid, s_neg, _MASKED * temperature)], -1) / temperature
  anchors = jnp.broadcast_to((state_valid & example_valid[:, None])[..., None], s_pos.shape)
  return weighted_mean(jax.nn.logsumexp(logits, -1) - s_pos / temperature, anchors)


def pcl_loss(z1, z2, state_valid, example_valid, config, rng):
  """Memory-state contrast, both directions averaged: a mean over anchors."""
  batch, n, slots, _ = z1.shape
  shape = (batch, config.pcl_negatives)
  seq_rng, window_rng, slot_rng = jax.random.split(rng, 3)
  negatives = (sample_other(seq_rng, example_valid, shape), jax.random.randint(window_rng, shape, 0, n),
               jax.random.randint(slot_rng, shape, 0, slots))
  (sum_12, count), (sum_21, _) = (pcl_direction(z1, z2, state_valid, example_valid, config.pcl_temperature, negatives),
                                  pcl_direction(z2, z1, state_valid, example_valid, config.pcl_temperature, negatives))
  return 0.5 * (sum_12 + sum_21) / jnp.maximum(count, 1.0)


# ----------------------------------------------------------------------------- the family loss


def pmt_loss(apply_fn, params, batch, *, rng, step, mutable, train):
  """The ``pmt`` family's loss (contract: ``lpcjax.losses``). Both views go through the encoder
  in one call, so BatchNorm normalizes them together."""
  del step
  config = apply_fn.__self__.config  # model.apply is bound to the PMT module
  x = batch["x"]
  size = x.shape[0]
  example_valid = batch["valid"] > 0 if "valid" in batch else jnp.ones((size,), bool)
  view_rng, dropout_rng, loss_rng = jax.random.split(rng, 3)
  both = jnp.concatenate(make_views(x, view_rng, config.view_noise, config.view_scale,
                                                config.view_mask), axis=0)
  variables = {"params": params, **mutable}
  if train:
    out, new_mutable = apply_fn(variables, both, train=True, rngs={"dropout": dropout_rng}, mutable=list(mutable))
  else:
    out, new_mutable = apply_fn(variables, both), mutable
  first, second = (jax.tree.map(lambda a: a[:size], out), jax.tree.map(lambda a: a[size:], out))
  k = out["tokens"].shape[1]
  geometry = config.geometry(k)
  hgcl_rng, pcl_rng = jax.random.split(loss_rng)
  terms = {}
  if config.icl_weight:
    total, count = icl_loss(first["cls_z"], second["cls_z"], config.icl_temperature, example_valid)
    terms["icl"] = (total / jnp.maximum(count, 1.0), config.icl_weight)
  if config.hgcl_weight:
    token_valid = first["token_valid"] & second["token_valid"]
    terms["hgcl"] = (hgcl_loss(first["tokens"], second["tokens"], token_valid, example_valid, geometry, config,
                               hgcl_rng), config.hgcl_weight)
  if config.pcl_weight:
    state_valid = first["window_valid"] & second["window_valid"]
    terms["pcl"] = (pcl_loss(first["memory_z"], second["memory_z"], state_valid, example_valid, config, pcl_rng),
                    config.pcl_weight)
  loss = sum(weight * value for value, weight in terms.values())
  count = example_valid.astype(jnp.float32).sum()
  metrics = {"loss": (loss * count, count), **{name: (value * count, count) for name, (value, _) in terms.items()}}
  return loss, metrics, new_mutable

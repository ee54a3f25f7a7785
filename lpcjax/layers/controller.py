"""The sparse controller of LPC-SM (the LPC-SM spec §4): prediction-error statistics -> a hard
sparse event mask with a learnable firing ratio ρ within bounds.

The paper's equations were lost (the LPC-SM spec marks them NOT FOUND); every such choice is a
config field below, with the default chosen and the reason beside it.
"""

from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from .common import bounded, bounded_init, constant_init
from .configs import ControllerConfig  # noqa: F401  (re-exported: the layer's config)


def running_standardize(r, stats=None, eps=1e-6):
  """r [batch, seq] -> ((r_t − μ_t) / σ_t, stats), μ, σ over every position ≤ t of the stream.

  ``stats`` carries the running moments from earlier calls ({"count", "shift", "sum", "sumsq"}
  [batch], from ``initial_stats``; None: the stream starts here), so a stream standardised chunk
  by chunk gives the values of one pass. The moments are of r − shift, shift = the stream's first
  r (the variance is shift invariant; this keeps float32 cancellation small when r has a large
  offset). The stream's first position gives 0.
  """
  if stats is None:
    stats = initial_stats(r.shape[0])
  shift = jnp.where(stats["count"] > 0, stats["shift"], r[:, 0])
  centred = r - shift[:, None]
  count = stats["count"][:, None] + jnp.arange(1, r.shape[1] + 1, dtype=r.dtype)
  total = stats["sum"][:, None] + jnp.cumsum(centred, axis=1)
  total_sq = stats["sumsq"][:, None] + jnp.cumsum(centred * centred, axis=1)
  mean = total / count
  var = jnp.maximum(total_sq / count - mean * mean, 0.0)
  z = (centred - mean) * jax.lax.rsqrt(var + eps)
  return z, {"count": count[:, -1], "shift": shift, "sum": total[:, -1], "sumsq": total_sq[:, -1]}


def initial_stats(batch):
  zeros = jnp.zeros((batch,), jnp.float32)
  return {"count": zeros, "shift": zeros, "sum": zeros, "sumsq": zeros}


def causal_standardize(r, eps=1e-6):
  """r [batch, seq] -> (r_t − μ_t) / σ_t with μ, σ over positions ≤ t (no future token leaks)."""
  return running_standardize(r, None, eps)[0]


class ControllerOutput(NamedTuple):
  mask: jax.Array  # [batch, seq], 0/1 forward, straight-through gradient
  p: jax.Array  # [batch, seq], σ(u), the straight-through surrogate
  ratio: jax.Array  # (), the sparse ratio ρ
  aux: jax.Array  # (), (mean(mask) − ρ)²
  stats: dict  # the running moments after this call (see ``running_standardize``)


class SparseController(nn.Module):
  """error e [batch, seq, d] (and optionally the carried ``stats``) -> ``ControllerOutput``.

  score="learned" (default):
      s_t = Σ_c w_c log(e_{t,c}² + eps) / ‖w‖,  z_t = running_standardize(s)_t
      u_t = z_t − Φ⁻¹(1 − ρ)
  score="affine":
      r_t = log(mean_c e_{t,c}² + eps),  z_t = running_standardize(r)_t
      u_t = scale · z_t + bias − Φ⁻¹(1 − ρ)
  then m_t = 1[u_t > 0] forward, dm/du = σ'(u) backward (straight through σ(u)).

  Tie to ρ: z is standardised over the stream so far and roughly normal (the learned score is a
  mean of d log-squared errors), so a fraction ≈ ρ of tokens passes Φ⁻¹(1 − ρ) whatever w is:
  the rate starts at ρ and follows it, and ρ gets the task gradient through the threshold.
  w starts uniform (ones). aux = (mean(m) − ρ)² is returned for the model to log or to add with
  a weight.
  """

  config: ControllerConfig

  @nn.compact
  def __call__(self, error, stats=None):
    cfg = self.config
    phi = self.param("ratio_logit", constant_init(bounded_init(cfg.ratio_init, cfg.ratio_min, cfg.ratio_max), ()), ())
    if not cfg.learn_ratio:
      phi = jax.lax.stop_gradient(phi)
    ratio = bounded(phi, cfg.ratio_min, cfg.ratio_max)

    error = error.astype(jnp.float32)
    if cfg.stop_error_gradient:
      error = jax.lax.stop_gradient(error)
    threshold = jax.scipy.special.ndtri(1.0 - ratio)
    if cfg.score == "learned":
      weight = self.param("score_weight", constant_init(1.0, (None,)), (error.shape[-1],))
      features = jnp.log(error * error + cfg.eps)
      score = features @ weight * jax.lax.rsqrt(jnp.sum(weight * weight) + cfg.eps)
      z, stats = running_standardize(score, stats, cfg.eps)
      u = z - threshold
    else:
      scale = self.param("scale", constant_init(1.0, ()), ())
      bias = self.param("bias", constant_init(0.0, ()), ())
      r = jnp.log(jnp.mean(error * error, axis=-1) + cfg.eps)
      z, stats = running_standardize(r, stats, cfg.eps)
      u = scale * z + bias - threshold
    p = jax.nn.sigmoid(u)
    hard = (u > 0).astype(p.dtype)
    mask = hard + (p - jax.lax.stop_gradient(p))  # p − p = 0 exactly: forward is 0/1
    aux = jnp.square(jnp.mean(mask) - ratio)
    return ControllerOutput(mask, p, ratio, aux, stats)

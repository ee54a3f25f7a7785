"""mHC, manifold-constrained hyper-connections (the LPC-SM spec §5): the residual transport across
n streams, with its Sinkhorn projection and the stream expand/collapse of a model that uses it.

The paper's equations were lost (the LPC-SM spec marks them NOT FOUND); every such choice is a
config field below, with the default chosen and the reason beside it.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from .common import constant_init, logit, normal_init
from .configs import MHCConfig  # noqa: F401  (re-exported: the layer's config)


def sinkhorn(logits, iterations=20):
  """logits [..., n, n] -> a doubly stochastic matrix [..., n, n] ∝ exp(logits).

  Alternate column and row normalisations of exp(logits), done as log-sum-exp subtractions so
  large logits (the identity init) cannot overflow. The last step normalises rows, so rows sum to
  1 exactly and columns to within the convergence of ``iterations`` (20 is the mHC default).
  """
  def normalize(_, log_p):
    log_p = log_p - jax.nn.logsumexp(log_p, axis=-2, keepdims=True)  # columns
    return log_p - jax.nn.logsumexp(log_p, axis=-1, keepdims=True)  # rows

  # fori_loop with a static count lowers to a scan: one compiled step, still differentiable.
  return jnp.exp(jax.lax.fori_loop(0, iterations, normalize, logits.astype(jnp.float32)))


def expand_streams(x, num_streams, spread=0.0):
  """x [batch, seq, d] -> [batch, seq, n, d]: stream i = (1 + spread · u_i) x.

  u = ``spread_patterns(n)[0]`` is zero-mean, so the mean stream is x. spread = 0: identical
  copies. A spread > 0 gives the first block's transport distinct streams to move (H_res acting
  on identical copies is the identity whatever H is, so its gradient would vanish there).
  """
  u, _ = spread_patterns(num_streams)
  gains = jnp.asarray([1.0 + spread * a for a in u], x.dtype)
  return x[..., None, :] * gains[:, None]


def collapse_streams(x, spread=0.0):
  """x [batch, seq, n, d] -> [batch, seq, d], Σ_i w_i x_i with w_i = (1 + spread · v_i) / n.

  Choice: fixed weights, no parameters. spread = 0 is the mean, which equals the plain
  residual stream for n = 1. v = ``spread_patterns(n)[1]`` is zero-mean and orthogonal to the
  pattern u of every stream deviation at the ``MHC`` init, so at init this readout equals the
  mean, and the mean is the plain residual stream (H_res is doubly stochastic and the post-mix
  gains average 1); a spread > 0 gives the streams unequal output gradients, without which the
  last block's transport gets no gradient (Σ_ij g_j H_ij is fixed by H's column sums).
  """
  _, v = spread_patterns(x.shape[-2])
  weights = jnp.asarray([(1.0 + spread * b) / x.shape[-2] for b in v], x.dtype)
  return jnp.einsum("n,...nd->...d", weights, x)


def spread_patterns(n):
  """Two zero-mean, mutually orthogonal patterns over n streams, each with max |value| = 1.

  u_i = linspace(−1, 1) (odd in i) for the post-mix, v = u² − mean(u²) rescaled (even in i,
  hence ⊥ u) for the pre-mix. n = 1: both 0; n = 2: v = 0 (one zero-mean direction only).
  """
  u = [0.0] * n if n == 1 else [-1.0 + 2.0 * i / (n - 1) for i in range(n)]
  mean_sq = sum(a * a for a in u) / n
  v = [a * a - mean_sq for a in u]
  top = max(abs(a) for a in v)
  v = [a / top if top > 1e-9 else 0.0 for a in v]
  return u, v


class MHC(nn.Module):
  """Residual transport across n streams around a sub-layer F ([batch, seq, d] -> same):

      x̃ = x / rms(x) over the flattened n·d state of a token          (dynamic only)
      pre  = act(α_pre x̃ φ_pre + β_pre),         act = σ or softmax      [n]
      post = 2 σ(α_post x̃ φ_post + β_post)                               [n]
      H    = sinkhorn(α_res mat(x̃ φ_res) + β_res)                        [n, n], doubly stochastic
      h = Σ_i pre_i x_i,   x_i <- Σ_j H[i, j] x_j + post_i F(h)

  x [batch, seq, n, d]. With ``dynamic=False`` only the static biases β remain (one set per
  layer, shared by all tokens). Init: α = 0, β_pre and β_post give the spread weights of
  ``MHCConfig``, β_res ≈ identity. With n = 1 the block is exactly x + F(x); with n streams that
  hold the same copy it is that copy + F(copy) on the mean stream.

  Use ``mhc(x, fn)``, or ``mix_in(x)`` and ``mix_out(x, y)`` when F is not one callable (both
  compute the coefficients of x; XLA shares the work).
  """

  config: MHCConfig

  def setup(self):
    cfg = self.config
    n = cfg.num_streams
    if n < 1:
      raise ValueError(f"num_streams must be >= 1, got {n}")
    u, v = spread_patterns(n)
    pre = [(1.0 + cfg.pre_spread * b) / n for b in v]
    post = [1.0 + cfg.post_spread * b for b in u]
    if cfg.pre_activation == "sigmoid":
      pre_init = [logit(w) if n > 1 else 30.0 for w in pre]  # n = 1: σ(30) = 1 to float32
    else:
      pre_init = [math.log(w) for w in pre]
    post_init = [logit(g / 2.0) for g in post]
    vector = lambda values: nn.with_logical_partitioning(lambda *_: jnp.asarray(values, jnp.float32), (None,))
    self.pre_logits = self.param("pre_logits", vector(pre_init), (n,))
    self.post_logits = self.param("post_logits", vector(post_init), (n,))
    diag = cfg.res_diag_init * jnp.eye(n)
    self.res_logits = self.param("res_logits", nn.with_logical_partitioning(lambda *_: diag, (None, None)), (n, n))
    if cfg.dynamic:
      std = cfg.dynamic_init_std or 1.0 / math.sqrt(n * cfg.d_model)
      # one projection for the three coefficient sets: [pre (n) | post (n) | res (n²)]
      self.dynamic_proj = self.param("dynamic_proj", normal_init(std, (None, None)),
                                     (n * cfg.d_model, n * n + 2 * n))
      self.dynamic_alpha = self.param("dynamic_alpha", constant_init(0.0, (None,)), (3,))

  def coefficients(self, x):
    """x [batch, seq, n, d] -> (pre [.., n], post [.., n], H [.., n, n]), float32; static
    coefficients have no batch or sequence axes."""
    cfg = self.config
    n = cfg.num_streams
    pre, post, res = self.pre_logits, self.post_logits, self.res_logits
    if cfg.dynamic:
      flat = x.reshape(x.shape[:-2] + (n * x.shape[-1],)).astype(jnp.float32)
      flat = flat * jax.lax.rsqrt(jnp.mean(flat * flat, axis=-1, keepdims=True) + 1e-6)
      z, alpha = flat @ self.dynamic_proj, self.dynamic_alpha
      pre = alpha[0] * z[..., :n] + pre
      post = alpha[1] * z[..., n:2 * n] + post
      res = alpha[2] * z[..., 2 * n:].reshape(z.shape[:-1] + (n, n)) + res
    pre = jax.nn.sigmoid(pre) if cfg.pre_activation == "sigmoid" else jax.nn.softmax(pre, axis=-1)
    return pre, 2.0 * jax.nn.sigmoid(post), sinkhorn(res, cfg.sinkhorn_iterations)

  def transport(self):
    """The static part of H_res [n, n] (the whole of it when ``dynamic=False``)."""
    return sinkhorn(self.res_logits, self.config.sinkhorn_iterations)

  def mix_in(self, x):
    """x [batch, seq, n, d] -> h [batch, seq, d], the sub-layer's input."""
    self._check(x)
    pre = self.coefficients(x)[0].astype(x.dtype)
    return jnp.einsum("...n,...nd->...d", jnp.broadcast_to(pre, x.shape[:-1]), x)

  def mix_out(self, x, y):
    """x [batch, seq, n, d], y = F(h) [batch, seq, d] -> the updated streams [batch, seq, n, d]."""
    self._check(x)
    _, post, res = self.coefficients(x)
    res = jnp.broadcast_to(res, x.shape[:-1] + (x.shape[-2],)).astype(x.dtype)
    post = jnp.broadcast_to(post, x.shape[:-1]).astype(x.dtype)
    return jnp.einsum("...ij,...jd->...id", res, x) + post[..., None] * y[..., None, :]

  def __call__(self, x, fn):
    return self.mix_out(x, fn(self.mix_in(x)))

  def _check(self, x):
    if x.ndim < 2 or x.shape[-2] != self.config.num_streams:
      raise ValueError(f"expected [..., {self.config.num_streams} streams, d], got shape {x.shape}")
    if self.config.dynamic and x.shape[-1] != self.config.d_model:
      raise ValueError(f"expected streams of width d_model={self.config.d_model}, got shape {x.shape}")

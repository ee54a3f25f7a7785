"""mHC, manifold-constrained hyper-connections (lpc-sm-spec.md §5): the residual transport across
n streams, with its Sinkhorn projection and the stream expand/collapse of a model that uses it.

The paper's equations were lost (lpc-sm-spec.md marks them NOT FOUND); every such choice is a
config field below, with the default chosen and the reason beside it.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from .common import constant_init


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


def expand_streams(x, num_streams):
  """x [batch, seq, d] -> [batch, seq, n, d]: every stream starts as a copy of the embedding."""
  return jnp.broadcast_to(x[..., None, :], x.shape[:-1] + (num_streams, x.shape[-1]))


def collapse_streams(x):
  """x [batch, seq, n, d] -> [batch, seq, d], the mean of the streams.

  Choice: the mean, not learned weights. It has no parameters, equals the plain residual stream
  for n = 1, and at the identity init (all streams equal) returns that common stream, so a model
  with mHC starts as the same function as one without; each block's pre-mix already learns which
  streams to read.
  """
  return jnp.mean(x, axis=-2)


@dataclasses.dataclass(frozen=True)
class MHCConfig:
  """Fields read by ``MHC``. Stream count and iterations are NOT FOUND in LPC-SM."""

  num_streams: int = 4  # the mHC paper's n
  sinkhorn_iterations: int = 20  # the mHC default; converges to ~1e-6 from the identity init
  # Diagonal logit of H_res at init (off-diagonal 0): each stream keeps e^6/(e^6 + n − 1) ≈ 0.99
  # of itself, i.e. ≈ identity, while the off-diagonal gradient is not yet vanishing.
  res_diag_init: float = 6.0


class MHC(nn.Module):
  """Residual transport across n streams around a sub-layer F ([batch, seq, d] -> same):

      h = Σ_i a_i x_i,  a = softmax(pre_logits)          (pre-mix, convex: h on a stream's scale)
      x_i <- Σ_j H[i, j] x_j + b_i F(h),  H = sinkhorn(res_logits),  b = 2 σ(post_logits)

  x [batch, seq, n, d]. Coefficients are static learned parameters (whether LPC-SM makes them
  input-dependent, as mHC does, is NOT FOUND; static is the simplest form that keeps the exact
  identity init). Init: a uniform, H ≈ identity, b = 2σ(0) = 1, so with n = 1 the block is
  exactly x + F(x) and with n streams that hold the same copy it is that copy + F(copy).

  Use ``mhc(x, fn)``, or ``mix_in(x)`` and ``mix_out(x, y)`` when F is not one callable.
  """

  config: MHCConfig

  def setup(self):
    n = self.config.num_streams
    if n < 1:
      raise ValueError(f"num_streams must be >= 1, got {n}")
    diag = self.config.res_diag_init * jnp.eye(n)
    self.pre_logits = self.param("pre_logits", constant_init(0.0, (None,)), (n,))
    self.post_logits = self.param("post_logits", constant_init(0.0, (None,)), (n,))
    self.res_logits = self.param("res_logits", nn.with_logical_partitioning(lambda *_: diag, (None, None)), (n, n))

  def transport(self):
    """H_res [n, n], doubly stochastic."""
    return sinkhorn(self.res_logits, self.config.sinkhorn_iterations)

  def mix_in(self, x):
    """x [batch, seq, n, d] -> h [batch, seq, d], the sub-layer's input."""
    self._check(x)
    weights = jax.nn.softmax(self.pre_logits).astype(x.dtype)
    return jnp.einsum("n,...nd->...d", weights, x)

  def mix_out(self, x, y):
    """x [batch, seq, n, d], y = F(h) [batch, seq, d] -> the updated streams [batch, seq, n, d]."""
    self._check(x)
    post = (2.0 * jax.nn.sigmoid(self.post_logits)).astype(x.dtype)
    return jnp.einsum("ij,...jd->...id", self.transport().astype(x.dtype), x) + post[:, None] * y[..., None, :]

  def __call__(self, x, fn):
    return self.mix_out(x, fn(self.mix_in(x)))

  def _check(self, x):
    if x.ndim < 2 or x.shape[-2] != self.config.num_streams:
      raise ValueError(f"expected [..., {self.config.num_streams} streams, d], got shape {x.shape}")

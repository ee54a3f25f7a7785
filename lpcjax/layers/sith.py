"""SITH log-compressed memory (Gradual Forgetting paper, Sec. 2).

A bank of L scale-invariant filters

    Phi(t', tau_i) = k^(k+1) / k! * (t' / tau_i)^k * exp(-k t' / tau_i),   t' = 1..M,

peaks at t' = tau_i, with tau_i = tau_min (1 + c)^(i-1) geometric, so the filters tile log-time
with a constant coefficient of variation (width proportional to tau_i). Applied depth-wise to
the embeddings f of the M tokens before a chunk, they give L "slots"

    f~(tau_i) = sum_{t'=1..M} Phi(t', tau_i) f(t - t'),

each a smoothed, lagged estimate of f(t - tau_i); a LayerNorm follows (sum_t' Phi ~ tau_i, so
the raw slots differ in scale by orders of magnitude).

This is the paper's form of the filter (not the lab's older code, which uses exponent k+1, a
1/tau prefactor and a k/(k+1) factor). On c: the paper writes c = 0.19, but its table of
windows (2, 4, ..., 8192 for L = 5, 9, ..., 53) is exactly c = 2^(1/4) - 1 ~ 0.1892;
``TABLE_C`` is that value and the experiment configs use it. The filters are computed in log
space in float64 (k^(k+1) overflows for k = 200) and returned in float32.
"""

import math

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from .configs import TABLE_C  # noqa: F401  (re-exported)


def sith_peaks(num_filters, c=0.19, tau_min=1.0):
  """tau*_i = tau_min (1 + c)^(i-1), i = 1..L (float64)."""
  return tau_min * (1.0 + c) ** np.arange(num_filters)


def sith_filters(num_filters, k, c=0.19, tau_min=1.0, horizon=None):
  """[L, M] float32: row i is Phi(t', tau*_i) for t' = 1..M; M = round(tau*_max) by default."""
  taus = sith_peaks(num_filters, c, tau_min)
  horizon = int(round(taus[-1])) if horizon is None else int(horizon)
  if num_filters < 1 or k <= 0 or horizon < 1:
    raise ValueError(f"sith_filters: need num_filters >= 1, k > 0, horizon >= 1; got "
                     f"{num_filters}, {k}, {horizon}")
  t = np.arange(1, horizon + 1, dtype=np.float64)[None, :]
  tau = taus[:, None]
  log_phi = (k + 1) * math.log(k) - math.lgamma(k + 1) + k * (np.log(t) - np.log(tau)) - k * t / tau
  return np.exp(log_phi).astype(np.float32)


class SITHCompressor(nn.Module):
  """history [batch, M, d] (oldest first; history[:, -1] is the token just before the chunk)
  -> slots [batch, L, d]: one matmul with the time-reversed filter bank, then LayerNorm.

  ``delta_pulse=True`` is the paper's control: the slots are the embeddings of the L tokens
  just before the chunk (no compression), under the same LayerNorm.
  """

  num_filters: int
  k: float
  c: float = TABLE_C
  tau_min: float = 1.0
  delta_pulse: bool = False
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, history):
    if self.delta_pulse:
      if history.shape[1] < self.num_filters:
        raise ValueError(f"SITHCompressor: delta pulse needs {self.num_filters} history tokens, "
                         f"got {history.shape[1]}")
      slots = history[:, -self.num_filters:].astype(jnp.float32)
    else:
      filters = sith_filters(self.num_filters, self.k, self.c, self.tau_min)
      if history.shape[1] != filters.shape[1]:
        raise ValueError(f"SITHCompressor: history has {history.shape[1]} tokens, the filters span "
                         f"M = {filters.shape[1]}")
      # f(t - t') is history[:, M - t']: reversing the filters' time axis aligns them.
      weights = jnp.asarray(filters[:, ::-1])
      slots = jnp.einsum("lm,bmd->bld", weights, history.astype(jnp.float32))
    return nn.LayerNorm(dtype=self.dtype, name="norm")(slots)

"""ONT, Orthogonal Novelty Transport (the LPC-SM spec §3): the slow-memory write rule that keeps
what the state already holds and amplifies the novel part of a write.

The paper's equations were lost (the LPC-SM spec marks them NOT FOUND); every such choice is a
config field below, with the default chosen and the reason beside it.
"""

import flax.linen as nn
import jax.numpy as jnp

from .common import bounded, bounded_init, constant_init
from .configs import ONTConfig  # noqa: F401  (re-exported: the layer's config)


def ont_write(write, state, factor, eps=1e-6):
  """Orthogonal Novelty Transport over the last axis: P w + κ (w − P w), P w = (⟨w,s⟩/‖s‖²) s.

  write, state [..., m]; factor κ broadcastable to [..., 1]. The part of the write the state
  already represents is kept exactly, the novelty (orthogonal to the state) is scaled by κ.
  ‖s‖² is floored at ``eps`` (not ε added): the split is exact whenever ‖s‖² > eps, and for a
  (near-)zero state, such as the initial slow state, the whole write counts as novel.
  """
  state = state.astype(write.dtype)
  dot = jnp.sum(write * state, axis=-1, keepdims=True)
  norm2 = jnp.maximum(jnp.sum(state * state, axis=-1, keepdims=True), eps)
  parallel = dot / norm2 * state
  return parallel + factor * (write - parallel)


class ONT(nn.Module):
  """(write [..., m], state [..., m]) -> the write to add to ``state``, same shape."""

  config: ONTConfig

  @nn.compact
  def gain(self):
    """κ ∈ [1, κ_max] (a scalar): for callers that apply ``ont_write`` inside a scan."""
    cfg = self.config
    init = bounded_init(cfg.kappa_init, 1.0, cfg.kappa_max)
    return bounded(self.param("kappa_logit", constant_init(init, ()), ()), 1.0, cfg.kappa_max)

  def __call__(self, write, state):
    if not self.config.enabled:
      return write
    return ont_write(write, state, self.gain(), self.config.eps)

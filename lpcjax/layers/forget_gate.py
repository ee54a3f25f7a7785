"""The FoX forget gate: log f_t per head, always in float32.

Variants (FoX paper, Sec. 4.5 and App. D):

* ``data_dependent`` (default): log f_t = log sigmoid(w . x_t + b), w ~ N(0, init_std), b = 0
  (the paper's init), or b from the T(b) init below with ``bias_init="timescale"``.
* ``data_independent``: log f_t = log sigmoid(b) with a learned per-head b.
* ``fixed``: the same with b frozen; Forgetting Attention then equals ALiBi with slope 1/T_h.

The last two start from the T(b) initialization: T(b) = -1 / log sigmoid(b) is the number of
steps a gate sigmoid(b) needs to decay by 1/e, and the heads' T_h are geometric between T_min
and T_max, so b_h = logit(exp(-1 / T_h)). (Zero init makes these variants fail: f = 0.5
halves every weight per token.)
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from .common import constant_init, normal_init
from .configs import GATE_VARIANTS, GateConfig  # noqa: F401  (re-exported: the layer's config)


def geometric_timescales(num_heads, t_min, t_max):
  """T_h = t_min * (t_max / t_min) ** (h / (H - 1)), h = 0..H-1 (float64 numpy)."""
  if num_heads == 1:
    return np.array([float(t_min)])
  return t_min * (t_max / t_min) ** (np.arange(num_heads) / (num_heads - 1))


def timescale_bias(timescales):
  """b with sigmoid(b) = exp(-1/T): b = -1/T - log(1 - exp(-1/T)), stable for large T."""
  inv = 1.0 / np.asarray(timescales, dtype=np.float64)
  return -inv - np.log(-np.expm1(-inv))


class ForgetGate(nn.Module):
  """x [batch, seq, d_model] -> log f [batch, seq, heads] float32 (all <= 0)."""

  config: GateConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    batch, seq_len = x.shape[:2]
    bias_init = timescale_bias(geometric_timescales(cfg.num_heads, cfg.t_min, cfg.t_max))
    if cfg.variant == "data_dependent":
      bias = jnp.asarray(bias_init, jnp.float32) if cfg.bias_init == "timescale" else 0.0
      logits = nn.Dense(cfg.num_heads, use_bias=True, dtype=jnp.float32, param_dtype=jnp.float32,
                        kernel_init=normal_init(cfg.init_std, ("embed", "heads")),
                        bias_init=constant_init(bias, ("heads",)), name="proj")(x.astype(jnp.float32))
      return jax.nn.log_sigmoid(logits)
    if cfg.variant == "data_independent":
      bias = self.param("bias", constant_init(jnp.asarray(bias_init, jnp.float32), ("heads",)),
                        (cfg.num_heads,), jnp.float32)
    else:  # "fixed"
      bias = jnp.asarray(bias_init, jnp.float32)
    return jnp.broadcast_to(jax.nn.log_sigmoid(bias), (batch, seq_len, cfg.num_heads))

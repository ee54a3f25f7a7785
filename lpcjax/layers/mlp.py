"""SwiGLU feed-forward block (LLaMA)."""

import math

import flax.linen as nn
import jax

from .common import dtype_of, normal_init


def swiglu_hidden_size(d_model, ratio, multiple_of=256):
  """hidden = multiple_of * ceil(int(d_model * ratio * 2/3) / multiple_of): the 2/3 keeps the
  three SwiGLU matrices at the parameter count of a ratio-wide two-matrix MLP (FoX/LLaMA recipe).

  The product is truncated to an integer before rounding up, as the official FoX code does, so
  that imported models get its widths: a product less than 1 above a multiple stays at that
  multiple (d = 110, ratio 3.5: 256.67 -> 256, where rounding up directly would give 512)."""
  return multiple_of * math.ceil(int(d_model * ratio * 2 / 3) / multiple_of)


class SwiGLU(nn.Module):
  """w_out(silu(w_gate x) * (w_up x)). Reads d_model, mlp_hidden_size, init_std, dtype and
  param_dtype from ``config``."""

  config: object

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    hidden = cfg.mlp_hidden_size
    dense = lambda features, axes, name: nn.Dense(
        features, use_bias=False, dtype=dtype_of(cfg.dtype), param_dtype=dtype_of(cfg.param_dtype),
        kernel_init=normal_init(cfg.init_std, axes), name=name)
    gate = dense(hidden, ("embed", "mlp"), "w_gate")(x)
    up = dense(hidden, ("embed", "mlp"), "w_up")(x)
    h = nn.with_logical_constraint(jax.nn.silu(gate) * up, ("activation_batch", "activation_length", "activation_mlp"))
    return dense(cfg.d_model, ("mlp", "embed"), "w_out")(h)

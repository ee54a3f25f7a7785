"""SwiGLU feed-forward block (LLaMA)."""

import dataclasses
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


@dataclasses.dataclass(frozen=True)
class MLPConfig:
  """What ``SwiGLU`` reads: ``d_model`` (input and output width), ``hidden`` (the width of
  w_gate and w_up, e.g. ``swiglu_hidden_size(d_model, 4.0)``), ``init_std`` (std of every
  kernel), ``dtype`` (compute) and ``param_dtype``, by name ("float32", "bfloat16", "float16").
  The family configs build it with ``mlp_config()``."""

  d_model: int
  hidden: int
  init_std: float = 0.02
  dtype: str = "float32"
  param_dtype: str = "float32"


class SwiGLU(nn.Module):
  """w_out(silu(w_gate x) * (w_up x)): x [..., d_model] -> [..., d_model], hidden width
  ``config.hidden``."""

  config: MLPConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    hidden = cfg.hidden
    dense = lambda features, axes, name: nn.Dense(
        features, use_bias=False, dtype=dtype_of(cfg.dtype), param_dtype=dtype_of(cfg.param_dtype),
        kernel_init=normal_init(cfg.init_std, axes), name=name)
    gate = dense(hidden, ("embed", "mlp"), "w_gate")(x)
    up = dense(hidden, ("embed", "mlp"), "w_up")(x)
    h = nn.with_logical_constraint(jax.nn.silu(gate) * up, ("activation_batch", "activation_length", "activation_mlp"))
    return dense(cfg.d_model, ("mlp", "embed"), "w_out")(h)

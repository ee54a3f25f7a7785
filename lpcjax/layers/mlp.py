"""SwiGLU feed-forward block (LLaMA)."""

import flax.linen as nn
import jax

from .common import dtype_of, normal_init
from .configs import MLPConfig, swiglu_hidden_size  # noqa: F401  (re-exported: the layer's config)


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

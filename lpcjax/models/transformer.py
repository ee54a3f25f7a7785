"""The ``transformer`` family: LLaMA or Pro blocks with plain causal softmax attention."""

import dataclasses
from typing import ClassVar, Optional

from lpcjax.config import require, require_choice
from lpcjax.layers.attention import AttentionConfig
from lpcjax.layers.common import DTYPES
from lpcjax.layers.mlp import MLPConfig, swiglu_hidden_size

from .decoder import REMAT_POLICIES, DecoderLM, init_cache
from .registry import Family, register


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Decoder LM config. ``block="pro"`` turns on QK-norm, output gate, output norm and KV-shift
  (each can be set alone for ablations: leave None to follow ``block``). The layers get typed
  configs built from it: ``attention_config()``, ``mlp_config()``."""

  family: ClassVar[str] = "transformer"
  forget_gate: ClassVar[str] = "none"
  prune_epsilon: ClassVar[Optional[float]] = None  # a field of FoXConfig

  vocab_size: int = 50257
  d_model: int = 768
  num_layers: int = 12
  num_heads: int = 12
  head_dim: Optional[int] = None  # None: d_model // num_heads
  block: str = "llama"
  qk_norm: Optional[bool] = None
  output_gate: Optional[bool] = None
  output_norm: Optional[bool] = None
  kv_shift: Optional[bool] = None
  qk_norm_shared_scale: bool = True  # one QK-norm scale for all heads (released FoX ckpts); the
  # output norm always has one scale per channel of every head, as in the official model
  mlp_ratio: Optional[float] = None  # None: 4.0 (LLaMA), 3.5 (Pro, offsets the output gate)
  mlp_multiple_of: int = 256
  use_rope: bool = True
  rope_theta: float = 10000.0
  tie_embeddings: bool = False
  norm_eps: float = 1e-6  # the block, final and output norms (QK-norm: 1e-5, as officially)
  init_std: float = 0.02
  dtype: str = "float32"  # compute dtype of activations and matmuls
  param_dtype: str = "float32"
  attention_impl: str = "auto"  # forgetting_attention backend
  attention_window: Optional[int] = None  # sliding-window attention; None = full causal
  remat_policy: str = "none"
  scan_layers: bool = True
  debug_checks: bool = False  # value checks in the attention op (checkify)

  def __post_init__(self):
    for name in ("vocab_size", "d_model", "num_layers", "num_heads", "mlp_multiple_of"):
      require(getattr(self, name) >= 1, f"model.{name}", f"must be >= 1, got {getattr(self, name)}")
    if self.head_dim is None:
      require(self.d_model % self.num_heads == 0, "model.num_heads",
              f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}; set model.head_dim")
    require(self.resolved_head_dim % 2 == 0 or not self.use_rope, "model.head_dim",
            f"RoPE needs an even head_dim, got {self.resolved_head_dim}")
    require_choice(self.block, "model.block", {"llama", "pro"})
    require_choice(self.dtype, "model.dtype", set(DTYPES))
    require_choice(self.param_dtype, "model.param_dtype", set(DTYPES))
    require_choice(self.remat_policy, "model.remat_policy", set(REMAT_POLICIES))
    require(self.rope_theta > 0, "model.rope_theta", "must be > 0")
    require(self.mlp_ratio is None or self.mlp_ratio > 0, "model.mlp_ratio", "must be > 0")
    require(self.attention_window is None or self.attention_window >= 1, "model.attention_window",
            f"must be >= 1 or None, got {self.attention_window}")
    from lpcjax.kernels import available_impls
    require_choice(self.attention_impl, "model.attention_impl", set(available_impls()))

  def describe(self):
    """A short label for plots and reports."""
    return self.block + (", RoPE" if self.use_rope else "")

  @property
  def resolved_head_dim(self):
    return self.head_dim if self.head_dim is not None else self.d_model // self.num_heads

  def _pro_part(self, value):
    return self.block == "pro" if value is None else value

  @property
  def use_qk_norm(self):
    return self._pro_part(self.qk_norm)

  @property
  def use_output_gate(self):
    return self._pro_part(self.output_gate)

  @property
  def use_output_norm(self):
    return self._pro_part(self.output_norm)

  @property
  def use_kv_shift(self):
    return self._pro_part(self.kv_shift)

  @property
  def mlp_hidden_size(self):
    ratio = self.mlp_ratio if self.mlp_ratio is not None else (3.5 if self.block == "pro" else 4.0)
    return swiglu_hidden_size(self.d_model, ratio, self.mlp_multiple_of)

  def gate_config(self):
    """The forget gate's ``GateConfig``: None, no gate (``FoXConfig`` has one)."""
    return None

  def attention_config(self):
    """The ``AttentionConfig`` of every block's attention layer."""
    return AttentionConfig(
        d_model=self.d_model, num_heads=self.num_heads, head_dim=self.resolved_head_dim, gate=self.gate_config(),
        use_rope=self.use_rope, rope_theta=self.rope_theta, use_qk_norm=self.use_qk_norm,
        qk_norm_shared_scale=self.qk_norm_shared_scale, use_output_norm=self.use_output_norm,
        use_output_gate=self.use_output_gate, use_kv_shift=self.use_kv_shift, norm_eps=self.norm_eps,
        window=self.attention_window, impl=self.attention_impl, prune_epsilon=self.prune_epsilon,
        debug=self.debug_checks, init_std=self.init_std, dtype=self.dtype, param_dtype=self.param_dtype)

  def mlp_config(self):
    """The ``MLPConfig`` of every block's SwiGLU."""
    return MLPConfig(d_model=self.d_model, hidden=self.mlp_hidden_size, init_std=self.init_std,
                     dtype=self.dtype, param_dtype=self.param_dtype)


register(Family("transformer", TransformerConfig, DecoderLM, init_cache=init_cache))

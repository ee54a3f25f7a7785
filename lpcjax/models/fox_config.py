"""The configs of the FoX paper's two families, ``transformer`` and ``fox`` (the modules are in
``lpcjax.models.fox``). No JAX: a command line checks them before JAX loads."""

import dataclasses
from typing import ClassVar, Optional

from lpcjax.config import LRScaledTrainConfig, require, require_choice
from lpcjax.layers.configs import GATE_VARIANTS, AttentionConfig, MLPConfig, swiglu_hidden_size

from .decoder_config import DecoderConfig, GateFields, KVHeadFields, check_impl_name


@dataclasses.dataclass(frozen=True)
class TransformerConfig(KVHeadFields, DecoderConfig):
  """Decoder LM config. ``block="pro"`` turns on QK-norm, output gate, output norm and KV-shift
  (each can be set alone for ablations: leave None to follow ``block``). The layers get typed
  configs built from it: ``attention_config()``, ``mlp_config()``."""

  family: ClassVar[str] = "transformer"
  forget_gate: ClassVar[str] = "none"
  prune_epsilon: ClassVar[Optional[float]] = None  # a field of FoXConfig

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
  attention_impl: str = "auto"  # forgetting_attention backend
  attention_window: Optional[int] = None  # sliding-window attention; None = full causal
  scan_layers: bool = True
  debug_checks: bool = False  # value checks in the attention op (checkify)

  def __post_init__(self):
    super().__post_init__()
    require(self.mlp_multiple_of >= 1, "model.mlp_multiple_of", f"must be >= 1, got {self.mlp_multiple_of}")
    require(self.resolved_head_dim % 2 == 0 or not self.use_rope, "model.head_dim",
            f"RoPE needs an even head_dim, got {self.resolved_head_dim}")
    require_choice(self.block, "model.block", {"llama", "pro"})
    require(self.rope_theta > 0, "model.rope_theta", "must be > 0")
    require(self.mlp_ratio is None or self.mlp_ratio > 0, "model.mlp_ratio", "must be > 0")
    require(self.attention_window is None or self.attention_window >= 1, "model.attention_window",
            f"must be >= 1 or None, got {self.attention_window}")
    self.check_kv_heads()
    check_impl_name(self.attention_impl)

  def describe(self):
    """A short label for plots and reports."""
    return self.block + (", RoPE" if self.use_rope else "")

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
        d_model=self.d_model, num_heads=self.num_heads, head_dim=self.resolved_head_dim,
        num_kv_heads=self.num_kv_heads, gate=self.gate_config(), use_rope=self.use_rope,
        rope_theta=self.rope_theta, use_qk_norm=self.use_qk_norm,
        qk_norm_shared_scale=self.qk_norm_shared_scale, use_output_norm=self.use_output_norm,
        use_output_gate=self.use_output_gate, use_kv_shift=self.use_kv_shift, norm_eps=self.norm_eps,
        window=self.attention_window, impl=self.attention_impl, prune_epsilon=self.prune_epsilon,
        debug=self.debug_checks, init_std=self.init_std, dtype=self.dtype, param_dtype=self.param_dtype)

  def mlp_config(self):
    """The ``MLPConfig`` of every block's SwiGLU."""
    return MLPConfig(d_model=self.d_model, hidden=self.mlp_hidden_size, init_std=self.init_std,
                     dtype=self.dtype, param_dtype=self.param_dtype)


@dataclasses.dataclass(frozen=True)
class FoXConfig(GateFields, TransformerConfig):
  """TransformerConfig plus the forget gate. No positional embedding by default (the paper's
  FoX); ``use_rope=True`` adds RoPE. ``gate_t_min``/``gate_t_max`` set the T(b) geometric bias
  init of the data-independent and fixed gates (see lpcjax.layers.forget_gate)."""

  family = "fox"
  # FoX's train section takes per-parameter learning-rate scales (train.lr_scales), e.g. a faster
  # gate bias: "forget_gate/proj/bias=10" (docs/mechanisms.md, the gate recipes).
  train_config_cls = LRScaledTrainConfig
  forget_gate: str = "data_dependent"
  use_rope: bool = False
  # Skip attention tiles whose decay bounds their softmax weight below this (e.g. 4.54e-5 =
  # e^-10); None is exact. See lpcjax.kernels.pruning for the bound.
  prune_epsilon: Optional[float] = None

  def __post_init__(self):
    super().__post_init__()
    self.check_gate(GATE_VARIANTS[1:])
    require(self.prune_epsilon is None or 0 < self.prune_epsilon < 1, "model.prune_epsilon",
            f"must be in (0, 1) or None, got {self.prune_epsilon}")

"""The config fields every decoder-only language model of the zoo shares, and their checks.

``DecoderConfig`` is the base of ``TransformerConfig``/``FoXConfig``, ``LPCSMConfig`` and
``SITHConfig``: sizes, initialisation, dtypes and rematerialisation. ``KVHeadFields`` adds
grouped-query attention (``num_kv_heads``) to the families whose attention is lpcjax's layer
(``transformer``, ``fox``, ``lpcsm``). ``GateFields`` adds the forget gate's init fields to
the families that can put FoX's gate in their attention (``fox``, ``lpcsm``); each of those
declares its own ``forget_gate`` default and the variants it allows.
"""

import dataclasses
from typing import Optional

import jax

from lpcjax.config import ModelConfig, require, require_choice
from lpcjax.kernels import unsupported
from lpcjax.layers.common import DTYPES
from lpcjax.layers.forget_gate import GateConfig

REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


def check_attention_impl(model, context_parallel=False):
  """``model.attention_impl`` against the kernel backends' declared support (head dim, compute
  dtype, window; with ``context_parallel``, the ring's pair kernels): a one-line ConfigError
  when the config is built, not a traceback when the model is traced. Not the platform: a
  config may be written on one machine for another. A model config that lacks one of the
  decoder's fields (a language model of one's own) is checked on those it has."""
  heads = getattr(model, "num_heads", None)
  kv_heads = getattr(model, "resolved_kv_heads", heads)
  problem = unsupported(model.attention_impl, head_dim=getattr(model, "resolved_head_dim", None),
                        dtype=getattr(model, "dtype", None), window=getattr(model, "attention_window", None),
                        context_parallel=context_parallel, kv_group=heads // kv_heads if heads else None)
  require(problem is None, "model.attention_impl", problem)


@dataclasses.dataclass(frozen=True)
class DecoderConfig(ModelConfig):
  """Sizes (``head_dim`` None: d_model // num_heads), the init std of every projection, the
  compute and parameter dtypes by name, and the remat policy of the scanned blocks."""

  vocab_size: int = 50257
  d_model: int = 768
  num_layers: int = 12
  num_heads: int = 12
  head_dim: Optional[int] = None
  init_std: float = 0.02
  dtype: str = "float32"  # compute dtype of activations and matmuls
  param_dtype: str = "float32"
  remat_policy: str = "none"

  def __post_init__(self):
    for name in ("vocab_size", "d_model", "num_layers", "num_heads"):
      require(getattr(self, name) >= 1, f"model.{name}", f"must be >= 1, got {getattr(self, name)}")
    if self.head_dim is None:
      require(self.d_model % self.num_heads == 0, "model.num_heads",
              f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}; set model.head_dim")
    else:
      require(self.head_dim >= 1, "model.head_dim", f"must be >= 1 or None, got {self.head_dim}")
    require_choice(self.dtype, "model.dtype", set(DTYPES))
    require_choice(self.param_dtype, "model.param_dtype", set(DTYPES))
    require_choice(self.remat_policy, "model.remat_policy", set(REMAT_POLICIES))

  @property
  def resolved_head_dim(self):
    return self.head_dim if self.head_dim is not None else self.d_model // self.num_heads


@dataclasses.dataclass(frozen=True)
class KVHeadFields:
  """Grouped-query attention: ``num_kv_heads`` key/value heads, each shared by num_heads /
  num_kv_heads consecutive query heads (None: num_heads, plain multi-head attention). The
  forget gate stays per query head; the decoding cache holds the key/value heads only."""

  num_kv_heads: Optional[int] = None

  def check_kv_heads(self):
    require(self.num_kv_heads is None or self.num_kv_heads >= 1, "model.num_kv_heads",
            f"must be >= 1 or None, got {self.num_kv_heads}")
    require(self.num_heads % self.resolved_kv_heads == 0, "model.num_kv_heads",
            f"num_heads={self.num_heads} is not divisible by num_kv_heads={self.num_kv_heads}")

  @property
  def resolved_kv_heads(self):
    return self.num_heads if self.num_kv_heads is None else self.num_kv_heads


@dataclasses.dataclass(frozen=True)
class GateFields:
  """The forget gate's init (see ``lpcjax.layers.forget_gate``): ``gate_bias_init`` "zero" (the
  FoX paper) or "timescale" (T(b) geometric init between ``gate_t_min`` and ``gate_t_max``,
  also the bias of the data-independent and fixed gates). A subclass declares ``forget_gate``."""

  gate_bias_init: str = "zero"
  gate_t_min: float = 2.0
  gate_t_max: float = 128.0

  def check_gate(self, variants):
    require_choice(self.forget_gate, "model.forget_gate", set(variants))
    require_choice(self.gate_bias_init, "model.gate_bias_init", {"zero", "timescale"})
    require(0 < self.gate_t_min <= self.gate_t_max, "model.gate_t_min",
            f"need 0 < gate_t_min <= gate_t_max, got ({self.gate_t_min}, {self.gate_t_max})")

  def gate_config(self):
    """The attention's ``GateConfig``; None when ``forget_gate`` is "none" (log f = 0)."""
    if self.forget_gate == "none":
      return None
    return GateConfig(num_heads=self.num_heads, variant=self.forget_gate, t_min=self.gate_t_min,
                      t_max=self.gate_t_max, bias_init=self.gate_bias_init, init_std=self.init_std)

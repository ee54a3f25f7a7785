"""The config fields every decoder-only language model of the zoo shares, and their checks.

``DecoderConfig`` is the base of ``TransformerConfig``/``FoXConfig``, ``LPCSMConfig`` and
``SITHConfig``: sizes, initialisation, dtypes and rematerialisation. ``KVHeadFields`` adds
grouped-query attention (``num_kv_heads``) to the families whose attention is lpcjax's layer
(``transformer``, ``fox``, ``lpcsm``). ``GateFields`` adds the forget gate's init fields to
the families that can put FoX's gate in their attention (``fox``, ``lpcsm``); each of those
declares its own ``forget_gate`` default and the variants it allows.
"""

import dataclasses
from typing import ClassVar, Optional

from lpcjax.config import ModelConfig, did_you_mean, require, require_choice
from lpcjax.data.recall_tasks import TASK_KINDS
from lpcjax.kernels.names import known_impls
from lpcjax.layers.configs import DTYPE_NAMES, GateConfig

# The names of the blocks' remat policies (lpcjax.models.decoder maps them to JAX's).
REMAT_POLICY_NAMES = ("none", "full", "dots", "dots_no_batch")

# What a language model reads: the generated recall tasks, text files and prepared token files.
LM_DATA_KINDS = (*TASK_KINDS, "text", "tokens")


def check_impl_name(impl):
  """``model.attention_impl`` names a backend: one line, before JAX loads, for a mistyped name.
  What the backend supports is checked when a run starts (the family's check)."""
  known = known_impls()
  require(impl in known, "model.attention_impl",
          f"unknown backend {impl!r}{did_you_mean(impl, known)}; known: {', '.join(known)} (a backend of one's own "
          "is registered with lpcjax.kernels.register_backend before the config is built)")


@dataclasses.dataclass(frozen=True)
class LanguageModelConfig(ModelConfig):
  """The base of a language model's config (no fields of its own): it reads tokens
  (``LM_DATA_KINDS``), and its ``vocab_size``, where it has one, holds every token of its data."""

  data_kinds: ClassVar[tuple] = LM_DATA_KINDS

  def check_experiment(self, experiment):
    vocab, data_vocab = getattr(self, "vocab_size", None), experiment.data.vocab_size
    require(vocab is None or vocab >= data_vocab, "model.vocab_size",
            f"{vocab} is smaller than the {experiment.data.kind} data's {data_vocab} tokens")


@dataclasses.dataclass(frozen=True)
class DecoderConfig(LanguageModelConfig):
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
    require_choice(self.dtype, "model.dtype", set(DTYPE_NAMES))
    require_choice(self.param_dtype, "model.param_dtype", set(DTYPE_NAMES))
    require_choice(self.remat_policy, "model.remat_policy", set(REMAT_POLICY_NAMES))

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

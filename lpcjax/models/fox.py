"""The ``fox`` family: the Forgetting Transformer (LLaMA or Pro blocks + Forgetting Attention)."""

import dataclasses
from typing import Optional

from lpcjax.config import require, require_choice
from lpcjax.layers.forget_gate import GATE_VARIANTS, GateConfig

from .decoder import DecoderLM, init_cache
from .registry import Family, register
from .transformer import TransformerConfig


@dataclasses.dataclass(frozen=True)
class FoXConfig(TransformerConfig):
  """TransformerConfig plus the forget gate. No positional embedding by default (the paper's
  FoX); ``use_rope=True`` adds RoPE. ``gate_t_min``/``gate_t_max`` set the T(b) geometric bias
  init of the data-independent and fixed gates (see lpcjax.layers.forget_gate)."""

  family = "fox"
  forget_gate: str = "data_dependent"
  use_rope: bool = False
  gate_t_min: float = 2.0
  gate_t_max: float = 128.0
  gate_bias_init: str = "zero"  # data-dependent gate: "zero" (paper) or "timescale" (T(b) init)
  # Skip attention tiles whose decay bounds their softmax weight below this (e.g. 4.54e-5 =
  # e^-10); None is exact. See lpcjax.kernels.pruning for the bound.
  prune_epsilon: Optional[float] = None

  def __post_init__(self):
    super().__post_init__()
    require_choice(self.forget_gate, "model.forget_gate", set(GATE_VARIANTS[1:]))
    require_choice(self.gate_bias_init, "model.gate_bias_init", {"zero", "timescale"})
    require(self.prune_epsilon is None or 0 < self.prune_epsilon < 1, "model.prune_epsilon",
            f"must be in (0, 1) or None, got {self.prune_epsilon}")
    require(0 < self.gate_t_min <= self.gate_t_max, "model.gate_t_min",
            f"need 0 < gate_t_min <= gate_t_max, got ({self.gate_t_min}, {self.gate_t_max})")

  def gate_config(self):
    return GateConfig(num_heads=self.num_heads, variant=self.forget_gate, t_min=self.gate_t_min,
                      t_max=self.gate_t_max, bias_init=self.gate_bias_init, init_std=self.init_std)


register(Family("fox", FoXConfig, DecoderLM, init_cache=init_cache))

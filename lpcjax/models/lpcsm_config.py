"""The ``lpcsm`` family's settings: ``LPCSMConfig`` (every choice the paper's lost equations
leave open is a field, with the reason beside it), its checks against the data, its train config and
the upgrades of configs saved by older versions. The model is in ``lpcjax.models.lpcsm``.
"""

import dataclasses
from typing import ClassVar

from lpcjax.config import LRScaledTrainConfig, require, require_choice
from lpcjax.layers.configs import (AttentionConfig, ControllerConfig, MemoryConfig, MHCConfig, MLPConfig,
                                  swiglu_hidden_size)

from .decoder_config import DecoderConfig, GateFields, KVHeadFields, check_impl_name


@dataclasses.dataclass(frozen=True)
class LPCSMTrainConfig(LRScaledTrainConfig):
  """The trainer's settings plus LPC-SM's per-parameter learning-rate scales (``lr_scales``):
  the controller's learned sparse ratio must cross its range within a short stage."""


@dataclasses.dataclass(frozen=True)
class LPCSMConfig(GateFields, KVHeadFields, DecoderConfig):
  """LPC-SM. Mechanism switches give the paper's ablations: ``mhc``, ``slow_memory``,
  ``predictive_coding``, ``ont``, ``stop_head`` (Stage A) and ``learn_ratio`` (Stage B's fixed
  ratio control). Sizes and rules marked NOT FOUND in the LPC-SM spec are chosen here."""

  family: ClassVar[str] = "lpcsm"
  train_config_cls: ClassVar[type] = LPCSMTrainConfig

  # Defaults: the 158M model (configs/lpcsm.py "paper"); the sizes, init and dtypes are
  # DecoderConfig's, as in the Transformer's config, so ``model.family=fox`` on an LPC-SM
  # config keeps them.
  mlp_ratio: float = 4.0  # SwiGLU width d·ratio·2/3, rounded up to mlp_multiple_of (LLaMA recipe)
  mlp_multiple_of: int = 256
  tie_embeddings: bool = True  # the LM head reads the embedding table (GPT-2 style)
  norm_eps: float = 1e-6  # RMSNorm: the spec's inference from the cited reference [28]
  scan_layers: ClassVar[bool] = True  # always one scanned block (no unrolled variant)

  # h⁰ = token + position embedding in the paper's words (learned vs sinusoidal NOT FOUND).
  # "sinusoidal": the Transformer's fixed sin/cos table at the absolute stream position (any
  # length, no parameters, streaming-consistent), scaled to RMS ``init_std`` so it starts on the
  # token embedding's scale; it lets the memory, the predictor and the controller (which see no
  # RoPE) know where in the stream a token is. "none" (default): token embedding only; attention
  # has RoPE. Measured (docs/lpcsm.md, tiny, seed 0): sinusoidal costs 0.23 held-out LM loss
  # (6.356 against 6.128) and breaks the 2040-token probe of a 256-token model (key CE 55.1
  # against 47.8: positions never seen in training), so it is the option, not the default.
  position_embedding: str = "none"

  # Local attention (window NOT FOUND). 256 tokens: an eighth of the 2048-token Stage-A context,
  # so anything further back must come through the memories.
  attention_window: int = 256
  rope_theta: float = 10000.0
  forget_gate: str = "none"  # "data_dependent": FoX's gate inside the window (GateFields)
  attention_impl: str = "auto"

  # Dual-timescale memory (lpcjax.layers.memory.MemoryConfig for the rules).
  chunk_size: int = 64
  memory_dim: int = 512
  fast_decay_init: float = 0.5
  slow_decay_init: float = 0.95
  summary_pool: str = "attention"  # "mean": the chunk mean (the only pooling of runs before issue #32)
  selective_decay: bool = True  # False: fixed per-channel decays
  summary_init_std: float | None = None  # W_c's init; None: 1/√d_model (MemoryConfig.init_std says why)
  slow_memory: bool = True  # False: the "− slow memory" ablation (the fast memory stays)
  ont: bool = True  # False: the "− ONT" ablation (plain slow write)
  kappa_max: float = 4.0
  kappa_init: float = 2.0

  # Predictive correction and its controller (ControllerConfig for the rules).
  predictive_coding: bool = True  # False: no predictor, controller or correction
  ratio_min: float = 0.05
  ratio_max: float = 0.5
  ratio_init: float = 0.2
  learn_ratio: bool = True  # False: Stage B's fixed-ratio control (ρ and the firing rate fixed)
  # "learned": a learned score over the error's channels, causally standardised and fired above
  # Φ⁻¹(1 − ρ), so ρ alone sets the rate; "affine": the scale/bias form before issue #21
  # (ControllerConfig.score). The temperature field is gone: it never moved the forward mask.
  controller_score: str = "learned"
  # W_c starts at zero (issue #21): the error is on the RMS-normalised scale (~1 per channel)
  # while the residual stream is at the embedding's ~init_std, so a W_c of std init_std made the
  # correction ~11x the stream at the fired tokens. At zero the model starts as the one without
  # correction (tested) and W_c still gets its gradient (mask · e · dL/dy); like the memory reads.
  correction_init_std: float = 0.0

  # Stop head: the second output head, p(the document ends after this token), trained with a
  # binary cross-entropy whose positives are the positions whose next token is ``stop_token``
  # (GPT-2's <|endoftext|>, which lpcjax's text data appends to every document). The paper
  # names a stop head but not its target; this is the "stopping behaviour" a LM can learn.
  stop_head: bool = True
  stop_token: int | None = None  # None: the last token of the vocabulary (50256 for GPT-2)

  # mHC (MHCConfig). n = 4 streams and 20 Sinkhorn iterations: the mHC paper's defaults.
  mhc: bool = True
  num_streams: int = 4
  sinkhorn_iterations: int = 20
  # Input-dependent coefficients (REFERENCE.md's mHC; α = 0 at init) and the asymmetric
  # pre/post-mix init that lets the streams diverge while the mean stream starts as the plain
  # residual; False / "softmax" / 0 / 0 is the static symmetric form before issue #21 (inert:
  # identical streams with symmetric parameters stay identical). MHCConfig has the reasons.
  mhc_dynamic: bool = True
  mhc_pre_activation: str = "sigmoid"
  mhc_post_spread: float = 0.5
  mhc_pre_spread: float = 0.5  # also the readout's (collapse_streams) weights
  mhc_stream_spread: float = 0.5  # the embedding's copies scaled by 1 ± 0.5 (expand_streams)
  # H_res's diagonal logit at init (MHCConfig.res_diag_init): 6 keeps ≈ 0.99 of each stream,
  # the near-identity of the mHC paper. Any value keeps the plain-residual start exactly (the
  # spread init is exact for every H of the form a·I + c·11ᵀ); a lower one starts the transport
  # mixing, with a larger gradient on its logits (∝ H_ij (1 − H_ij)).
  mhc_res_diag_init: float = 6.0

  # Auxiliary losses, added to the LM cross-entropy (weights NOT FOUND; each one is logged):
  # the predictor's mean squared error (it trains only the predictor: its target is detached),
  # the stop head's BCE, and (mean(mask) − ρ)², which ties the realised firing rate to ρ.
  prediction_loss_weight: float = 0.1
  stop_loss_weight: float = 0.1
  ratio_loss_weight: float = 1.0

  def __post_init__(self):
    super().__post_init__()
    for name in ("mlp_multiple_of", "attention_window", "chunk_size", "memory_dim", "num_streams",
                 "sinkhorn_iterations"):
      require(getattr(self, name) >= 1, f"model.{name}", f"must be >= 1, got {getattr(self, name)}")
    require(self.resolved_head_dim % 2 == 0, "model.head_dim",
            f"RoPE needs an even head_dim, got {self.resolved_head_dim}")
    self.check_gate({"none", "data_dependent"})
    require(0 < self.ratio_min < self.ratio_init < self.ratio_max < 1, "model.ratio_init",
            f"need 0 < ratio_min < ratio_init < ratio_max < 1, "
            f"got ({self.ratio_min}, {self.ratio_init}, {self.ratio_max})")
    require(1 < self.kappa_init < self.kappa_max, "model.kappa_init",
            f"need 1 < kappa_init < kappa_max, got ({self.kappa_init}, {self.kappa_max})")
    for name in ("fast_decay_init", "slow_decay_init"):
      require(0 < getattr(self, name) < 1, f"model.{name}", "must be in (0, 1)")
    require(0 <= self.resolved_stop_token < self.vocab_size, "model.stop_token",
            f"{self.stop_token} is not a token of the {self.vocab_size}-token vocabulary")
    self.check_kv_heads()
    check_impl_name(self.attention_impl)

    require_choice(self.position_embedding, "model.position_embedding", {"sinusoidal", "none"})
    require_choice(self.summary_pool, "model.summary_pool", {"mean", "attention"})
    require(self.summary_init_std is None or self.summary_init_std >= 0, "model.summary_init_std",
            f"must be >= 0 or None, got {self.summary_init_std}")
    require_choice(self.controller_score, "model.controller_score", {"learned", "affine"})
    require_choice(self.mhc_pre_activation, "model.mhc_pre_activation", {"sigmoid", "softmax"})
    for name in ("mhc_post_spread", "mhc_pre_spread", "mhc_stream_spread"):
      require(0 <= getattr(self, name) < 1, f"model.{name}", "must be in [0, 1)")
    require(self.correction_init_std >= 0, "model.correction_init_std", "must be >= 0")

  def check_experiment(self, experiment):
    """The vocabulary, whole chunks per sequence, and no document restarts."""
    super().check_experiment(experiment)
    data = experiment.data
    require(data.seq_len % self.chunk_size == 0, "data.seq_len",
            f"{data.seq_len} must be a multiple of model.chunk_size={self.chunk_size} (the memories write whole "
            "chunks)")
    require(not getattr(data, "segment_ids", False), "data.segment_ids",
            "lpcsm's chunked memories do not restart at document boundaries; set data.segment_ids=false")

  def describe(self):
    off = [name for name in ("mhc", "slow_memory", "predictive_coding", "ont", "stop_head") if not getattr(self, name)]
    return "LPC-SM" + "".join(f" −{name}" for name in off) + ("" if self.learn_ratio else ", fixed ratio")

  @property
  def resolved_stop_token(self):
    return self.vocab_size - 1 if self.stop_token is None else self.stop_token

  @property
  def mlp_hidden_size(self):
    return swiglu_hidden_size(self.d_model, self.mlp_ratio, self.mlp_multiple_of)

  @property
  def streams(self):
    return self.num_streams if self.mhc else 1

  def attention_config(self):
    """The local attention: a sliding window with RoPE (and FoX's gate if ``forget_gate``)."""
    return AttentionConfig(
        d_model=self.d_model, num_heads=self.num_heads, head_dim=self.resolved_head_dim,
        num_kv_heads=self.num_kv_heads, gate=self.gate_config(), use_rope=True, rope_theta=self.rope_theta,
        norm_eps=self.norm_eps, window=self.attention_window,
        impl=self.attention_impl, init_std=self.init_std, dtype=self.dtype, param_dtype=self.param_dtype)

  def mlp_config(self):
    return MLPConfig(d_model=self.d_model, hidden=self.mlp_hidden_size, init_std=self.init_std,
                     dtype=self.dtype, param_dtype=self.param_dtype)

  def memory_config(self):
    return MemoryConfig(d_model=self.d_model, memory_dim=self.memory_dim, chunk_size=self.chunk_size,
                        slow=self.slow_memory, ont=self.ont, fast_decay_init=self.fast_decay_init,
                        slow_decay_init=self.slow_decay_init, summary_pool=self.summary_pool,
                        selective_decay=self.selective_decay, kappa_max=self.kappa_max, kappa_init=self.kappa_init,
                        init_std=self.summary_init_std)

  def controller_config(self):
    return ControllerConfig(ratio_min=self.ratio_min, ratio_max=self.ratio_max, ratio_init=self.ratio_init,
                            learn_ratio=self.learn_ratio, score=self.controller_score)

  def mhc_config(self):
    return MHCConfig(num_streams=self.num_streams, d_model=self.d_model, sinkhorn_iterations=self.sinkhorn_iterations,
                     dynamic=self.mhc_dynamic, pre_activation=self.mhc_pre_activation,
                     post_spread=self.mhc_post_spread, pre_spread=self.mhc_pre_spread,
                     res_diag_init=self.mhc_res_diag_init)


def upgrade_saved_lpcsm(values):
  """A config.json of an older lpcjax: ``model.controller_temperature`` was removed (issue #21:
  it never moved the mask); its old default is dropped, any other value stays (and fails). A run
  without ``summary_pool`` / ``selective_decay`` was the mean-pooled memory with fixed decays."""
  if values["model"].get("controller_temperature") == 1.0:
    values = {**values, "model": {k: v for k, v in values["model"].items() if k != "controller_temperature"}}
  # Runs saved before the memory's pooling, selective decays and fan-in summary init (issue #32)
  # had none of them.
  values = {**values, "model": {"summary_pool": "mean", "selective_decay": False, "summary_init_std": 0.02,
                                **values["model"]}}
  return values

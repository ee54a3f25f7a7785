"""The ``pmt`` family's config and train config (the model is in ``lpcjax.models.pmt``). No JAX:
a command line checks them before JAX loads."""

import dataclasses
from typing import ClassVar

from lpcjax.config import (ConfigError, LRScaledTrainConfig, ModelConfig, ParameterGroup, check_parameter_group,
                           require, require_choice)
from lpcjax.layers.configs import PMAConfig, num_windows


# The memory gates of the PMT spec §9's own parameter group (``train.gate_patterns``): the
# reset/carry gate, the write and read gates, the SkipGate, the aggregator's γ and head × copy
# bias. Scalars and zero-init rows whose gradients are small and noisy beside the rest.
GATE_PATTERNS = ("carry_gate", "/write/", "read_gate", "skip_gate", "aggregator/gamma", "copy_bias")


@dataclasses.dataclass(frozen=True)
class PMTTrainConfig(LRScaledTrainConfig):
  """The trainer's settings plus PMT's optimizer extras (the PMT spec §9), each off by default:
  learning-rate scales (``lr_scales``: the gates' larger learning rate, configs/pmt.py) and the
  gates' own parameter group."""

  # The gates' own parameter group: the parameters whose path contains one of these patterns
  # (``GATE_PATTERNS``) get their own global-norm clip and Adam b2, and no weight decay, so the
  # clipping of the large group never shrinks their small gradients. Empty: one group.
  gate_patterns: tuple[str, ...] = ()
  gate_adam_b2: float = 0.95
  gate_grad_clip: float = 100.0

  def __post_init__(self):
    super().__post_init__()
    check_parameter_group(self.gate_patterns, self.gate_adam_b2, self.gate_grad_clip, "gate")

  def parameter_groups(self):
    if not self.gate_patterns:
      return ()
    return (ParameterGroup("gate", self.gate_patterns, self.gate_adam_b2, self.gate_grad_clip),)


@dataclasses.dataclass(frozen=True)
class PMTConfig(ModelConfig):
  """PMT encoder, its baseline and its pre-training losses.

  Choices where the PMT spec says NOT FOUND (each a field): patch 8 / stride 4 (per-dataset sizes
  not found; the later code uses 15/6 and 161/80); n_m = 1 (the window ablation's value);
  one neighbourhood layer after the PMA stack (the later code uses 3); γ = 1; HGCL: the
  reconstruction of the PMT spec §7.2 with σ_tok = σ_win = 1 and τ = 0.5 (see pmt_losses);
  views: additive Gaussian jitter 0.01 / 0.03 (the later code's weak/strong views).
  """

  family: ClassVar[str] = "pmt"
  data_kinds: ClassVar[tuple] = ("series", "synthetic_series")
  train_config_cls: ClassVar[type] = PMTTrainConfig

  d_model: int = 64
  num_heads: int = 4
  mlp_ratio: float = 4.0
  num_blocks: int = 3  # B
  attention: str = "pma"  # "full": the Transformer baseline (full attention, same read-outs)
  num_slots: int = 1  # n_m
  window_fraction: float = 0.2  # ρ: W = ⌊ρK⌋
  window_tokens: int = 0  # > 0: W directly
  window_stride: int = 0  # > 0: S directly; 0: ⌊window_stride_fraction · W⌋
  window_stride_fraction: float = 0.5  # the spec's S = ⌊W/2⌋; 1: non-overlapping windows (the cue probe's PMA)
  memory: str = "progressive"  # "stateless": no carrier, no vertical reuse (ablation)
  streaming: bool = False  # scan over windows (O(W) memory); same function as vectorized
  state_attends_prev: bool = True
  write_gate: bool = True
  carry_gate: bool = True
  state_noise: float = 0.01
  aggregator_gamma: float = 1.0
  patch_size: int = 8  # P
  patch_stride: int = 4  # S_p
  tokenizer_kernels: int = 256  # k
  post_layers: int = 1  # neighbourhood-masked layers after [CLS] is re-attached (>= 1: [CLS] reads through them)
  neighbourhood: int = 16  # tokens attend tokens within this distance there
  dropout: float = 0.1
  projection_dim: int = 512  # hidden width of the projection heads (output: d_model)
  projection_dropout: float = 0.1
  rope_theta: float = 10000.0
  norm_eps: float = 1e-6
  # pre-training (pmt_losses)
  # Views (pmt_losses.augment), one entry per view. The spec's are jitter only (0.01 / 0.03); so
  # weak that the two views of a series nearly coincide and PCL sits at its floor at once.
  view_noise: tuple[float, ...] = (0.01, 0.03)  # std of the additive jitter
  view_scale: tuple[float, ...] = (0.0, 0.0)  # std of a per-series, per-channel factor 1 + N(0, s²)
  view_mask: tuple[float, ...] = (0.0, 0.0)  # fraction of samples set to 0
  icl_weight: float = 1.0  # λ; 0 switches a loss off
  hgcl_weight: float = 1.0
  pcl_weight: float = 1.0
  icl_temperature: float = 0.6
  hgcl_temperature: float = 0.5
  hgcl_token_sigma: float = 1.0  # Gaussian width of the soft positives, in tokens
  hgcl_window_sigma: float = 1.0  # ... in windows
  hgcl_negatives: int = 32  # sampled negative tokens per anchor
  pcl_temperature: float = 0.9
  pcl_negatives: int = 512

  def __post_init__(self):
    for name in ("d_model", "num_heads", "num_blocks", "num_slots", "patch_size", "patch_stride",
                 "tokenizer_kernels", "post_layers", "neighbourhood", "projection_dim", "hgcl_negatives",
                 "pcl_negatives"):
      require(getattr(self, name) >= 1, f"model.{name}", f"must be >= 1, got {getattr(self, name)}")
    require(self.d_model % self.num_heads == 0 and (self.d_model // self.num_heads) % 2 == 0, "model.num_heads",
            f"d_model={self.d_model} must split into num_heads={self.num_heads} heads of even size (RoPE)")
    require_choice(self.attention, "model.attention", {"pma", "full"})
    require_choice(self.memory, "model.memory", {"progressive", "stateless"})
    require(0 < self.window_fraction <= 1, "model.window_fraction", f"must be in (0, 1], got {self.window_fraction}")
    require(0 < self.window_stride_fraction <= 1, "model.window_stride_fraction",
            f"must be in (0, 1], got {self.window_stride_fraction}")
    require(self.window_tokens >= 0 and self.window_stride >= 0, "model.window_tokens",
            "window_tokens and window_stride must be >= 0 (0: from window_fraction)")
    for name in ("view_noise", "view_scale", "view_mask"):
      value = getattr(self, name)
      require(len(value) == 2 and min(value) >= 0, f"model.{name}", f"two values >= 0 (one per view), got {value}")
    require(max(self.view_mask) < 1, "model.view_mask", f"a fraction < 1, got {self.view_mask}")
    for name in ("icl_weight", "hgcl_weight", "pcl_weight", "dropout", "projection_dropout", "state_noise"):
      require(getattr(self, name) >= 0, f"model.{name}", "must be >= 0")
    for name in ("icl_temperature", "hgcl_temperature", "hgcl_token_sigma", "hgcl_window_sigma", "pcl_temperature"):
      require(getattr(self, name) > 0, f"model.{name}", "must be > 0")
    require(self.icl_weight + self.hgcl_weight + self.pcl_weight > 0, "model.icl_weight",
            "every loss weight is 0: nothing to train")

  @property
  def mlp_dim(self):
    return int(self.mlp_ratio * self.d_model)

  def pma(self):
    return PMAConfig(d_model=self.d_model, num_heads=self.num_heads, mlp_dim=self.mlp_dim, num_slots=self.num_slots,
                     memory=self.memory, state_attends_prev=self.state_attends_prev, write_gate=self.write_gate,
                     carry_gate=self.carry_gate, state_noise=self.state_noise, aggregator_gamma=self.aggregator_gamma,
                     rope_theta=self.rope_theta, dropout=self.dropout, norm_eps=self.norm_eps,
                     streaming=self.streaming)

  def num_tokens(self, seq_len):
    require(seq_len >= self.patch_size, "data.seq_len",
            f"series of {seq_len} samples are shorter than one patch (model.patch_size={self.patch_size})")
    return (seq_len - self.patch_size) // self.patch_stride + 1

  def check_experiment(self, experiment):
    """Negatives in every batch, and windows that fit the series' tokens."""
    data = experiment.data
    require(data.batch_size >= 2, "data.batch_size",
            f"contrastive pre-training needs >= 2 series per batch (the negatives), got {data.batch_size}")
    if data.seq_len:
      self.geometry(self.num_tokens(data.seq_len))

  def geometry(self, num_tokens):
    """(W, S, N) for K tokens; a one-line ConfigError when the windows do not fit."""
    window = self.window_tokens or max(2, int(self.window_fraction * num_tokens))
    if window > num_tokens:
      raise ConfigError(f"model.window_tokens: a window of {window} tokens is longer than the {num_tokens} tokens "
                        f"of a series (patch {self.patch_size}, stride {self.patch_stride})")
    stride = self.window_stride or max(1, int(self.window_stride_fraction * window))
    require(stride <= window, "model.window_stride", f"{stride} is larger than the window ({window} tokens)")
    return window, stride, num_windows(num_tokens, window, stride)

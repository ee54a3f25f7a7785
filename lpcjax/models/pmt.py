"""The ``pmt`` family: the Progressive Memory Transformer, a time-series encoder (the PMT spec).

x [batch, T, C] (NaN = missing) -> patch tokens (K = ⌊(T − P)/S_p⌋ + 1) -> a stack of PMA blocks
(``lpcjax.layers.pma``; or, with ``attention="full"``, the paper's Transformer baseline: the same
number of full-attention layers) -> [CLS] re-attached, sinusoidal positions, ``post_layers``
neighbourhood-masked layers -> read-outs:

* ``tokens`` [batch, K, d] and ``token_valid`` (local scale: HGCL token level);
* ``memories`` [batch, N, n_m, d], the last block's window memories (mid scale: PCL, the cue
  probe). The baseline has no memory: its "memories" are the masked means of each window's
  tokens (n_m = 1), so the same losses and probes run on it;
* ``cls`` [batch, d] (global scale: ICL, linear probes);
* ``cls_z`` [batch, p] and ``memory_z`` [batch, N, n_m, p]: the contrastive projections
  (ℓ2-normalized; one head per memory slot, as in the later code).

Windows: W = ⌊ρK⌋ (``window_fraction`` ρ = 0.2, or ``window_tokens``), S = ⌊W/2⌋ (or
``window_stride_fraction`` · W, 1 for the non-overlapping windows of the paper's cue probe).
The losses are in ``lpcjax.models.pmt_losses``; the evaluator (probes) in
``lpcjax.evaluation.series``.
"""

import dataclasses
import math
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lpcjax import data
from lpcjax.config import (ConfigError, LRScaledTrainConfig, ModelConfig, ParameterGroup, check_parameter_group,
                           require, require_choice)
from lpcjax.evaluation.series import SeriesEvaluator
from lpcjax.layers.common import RMSNorm, normal_init
from lpcjax.layers.pma import EncoderLayer, PMAConfig, PMAStack, masked_mean, num_windows, window_tokens

from .pmt_losses import normalize, pmt_loss
from .family import Family, register


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

  def geometry(self, num_tokens):
    """(W, S, N) for K tokens; a one-line ConfigError when the windows do not fit."""
    window = self.window_tokens or max(2, int(self.window_fraction * num_tokens))
    if window > num_tokens:
      raise ConfigError(f"model.window_tokens: a window of {window} tokens is longer than the {num_tokens} tokens "
                        f"of a series (patch {self.patch_size}, stride {self.patch_stride})")
    stride = self.window_stride or max(1, int(self.window_stride_fraction * window))
    require(stride <= window, "model.window_stride", f"{stride} is larger than the window ({window} tokens)")
    return window, stride, num_windows(num_tokens, window, stride)


# The memory gates of the PMT spec §9's own parameter group (``train.gate_patterns``): the
# reset/carry gate, the write and read gates, the SkipGate, the aggregator's γ and head × copy
# bias. Scalars and zero-init rows whose gradients are small and noisy beside the rest.
GATE_PATTERNS = ("carry_gate", "/write/", "read_gate", "skip_gate", "aggregator/gamma", "copy_bias")


def sinusoidal_positions(length, dim):
  """The fixed sine/cosine table [length, dim] of "Attention is all you need"."""
  position = np.arange(length)[:, None]
  freq = np.exp(-math.log(10000.0) * np.arange(0, dim, 2) / dim)
  table = np.zeros((length, dim), np.float32)
  table[:, 0::2], table[:, 1::2] = np.sin(position * freq), np.cos(position * freq)
  return jnp.asarray(table)


class PatchTokenizer(nn.Module):
  """x [batch, T, C] -> tokens [batch, K, d], token_valid [batch, K], cls [batch, d].

  Conv1d (no bias, k kernels of P samples, stride S_p) -> BatchNorm (over valid tokens) -> GELU
  -> Dropout -> Dense -> GELU. Missing samples (NaN in any channel) are zero-filled; a token is
  valid when more than half of its samples are. [CLS] is a learned vector in kernel space that
  goes through the same projection.
  """

  kernels: int
  patch_size: int
  patch_stride: int
  d_model: int
  dropout: float = 0.0

  @nn.compact
  def __call__(self, x, train=False):
    missing = jnp.isnan(x)
    present = ~missing.any(-1)
    x = jnp.where(missing, 0.0, x)
    conv = nn.Conv(self.kernels, (self.patch_size,), strides=(self.patch_stride,), padding="VALID", use_bias=False,
                   kernel_init=normal_init(0.02, (None, None, "mlp")))
    features = conv(x)
    window = (1, self.patch_size)
    coverage = jax.lax.reduce_window(present.astype(jnp.float32), 0.0, jax.lax.add, window,
                                     (1, self.patch_stride), "VALID") / self.patch_size
    token_valid = coverage > 0.5
    features = nn.BatchNorm(use_running_average=not train, momentum=0.9)(features, mask=token_valid[..., None])
    features = nn.Dropout(self.dropout, deterministic=not train)(nn.gelu(features))
    project = nn.Dense(self.d_model, kernel_init=normal_init(0.02, ("mlp", "embed")))
    cls = self.param("cls", normal_init(0.02, ("mlp",)), (self.kernels,))
    return nn.gelu(project(features)), token_valid, nn.gelu(project(cls))[None].repeat(x.shape[0], 0)


class ProjectionHead(nn.Module):
  """Linear(d -> hidden) - GELU - Dropout - Linear(hidden -> d) - LayerNorm, then ℓ2-normalized.
  ``num_copies`` > 0: one head per copy, for inputs [..., num_copies, d] (one per memory slot)."""

  hidden: int
  dropout: float = 0.0
  num_copies: int = 0

  @nn.compact
  def __call__(self, x, train=False):
    d = x.shape[-1]
    lead = (self.num_copies,) if self.num_copies else ()
    first = self.param("hidden", normal_init(0.02, (None, "embed", "mlp")[-len(lead) - 2:]), lead + (d, self.hidden))
    second = self.param("out", normal_init(0.02, (None, "mlp", "embed")[-len(lead) - 2:]), lead + (self.hidden, d))
    spec = "...nd,ndh->...nh" if lead else "...d,dh->...h"
    h = jnp.einsum(spec, x, first) + self.param("hidden_bias", nn.initializers.zeros, lead + (self.hidden,))
    h = nn.Dropout(self.dropout, deterministic=not train)(nn.gelu(h))
    z = jnp.einsum(spec, h, second) + self.param("out_bias", nn.initializers.zeros, lead + (d,))
    z = nn.LayerNorm()(z)
    return normalize(z)


def neighbourhood_mask(token_valid, neighbourhood):
  """[batch, 1 + K, 1 + K]: [CLS] (row/column 0) attends and is attended by every valid token;
  tokens attend the valid tokens within ``neighbourhood`` positions."""
  k = token_valid.shape[1]
  distance = np.abs(np.arange(k)[:, None] - np.arange(k)[None])
  allowed = np.ones((k + 1, k + 1), bool)
  allowed[1:, 1:] = distance <= neighbourhood
  keys = jnp.concatenate([jnp.ones_like(token_valid[:, :1]), token_valid], axis=1)
  return (allowed & keys[:, None, :]) | np.eye(k + 1, dtype=bool)


class PMT(nn.Module):
  """The PMT encoder (or its full-attention baseline); see the module docstring."""

  config: PMTConfig

  @nn.compact
  def __call__(self, x, train=False):
    cfg = self.config
    cfg.num_tokens(x.shape[1])  # a one-line error for series shorter than a patch
    tokens, valid, cls = PatchTokenizer(cfg.tokenizer_kernels, cfg.patch_size, cfg.patch_stride, cfg.d_model,
                                        cfg.dropout, name="tokenizer")(x, train)
    k = tokens.shape[1]
    window, stride, n = cfg.geometry(k)
    if cfg.attention == "pma":
      tokens, memories = PMAStack(cfg.pma(), cfg.num_blocks, window, stride, name="pma")(tokens, valid, train)
    else:
      positions = jnp.arange(k)
      mask = (valid[:, None, :] | np.eye(k, dtype=bool))
      for b in range(cfg.num_blocks):
        tokens = self._layer(f"block_{b}")(tokens, tokens, mask, positions, positions, train)
      tokens = RMSNorm(cfg.norm_eps, name="blocks_norm")(tokens)
      memories = masked_mean(window_tokens(tokens, window, stride, n), window_tokens(valid, window, stride, n), -2)
      memories = memories[:, :, None]
    sequence = jnp.concatenate([cls[:, None], tokens], axis=1) + sinusoidal_positions(k + 1, cfg.d_model)
    mask = neighbourhood_mask(valid, cfg.neighbourhood)
    for layer in range(cfg.post_layers):
      sequence = self._layer(f"post_{layer}")(sequence, sequence, mask, train=train)
    sequence = RMSNorm(cfg.norm_eps, name="final_norm")(sequence)
    window_valid = window_tokens(valid, window, stride, n).any(-1)
    cls_z = ProjectionHead(cfg.projection_dim, cfg.projection_dropout, name="icl_head")(sequence[:, 0], train)
    memory_z = ProjectionHead(cfg.projection_dim, cfg.projection_dropout, memories.shape[2],
                              name="pcl_heads")(memories, train)
    return {"cls": sequence[:, 0], "tokens": sequence[:, 1:], "token_valid": valid, "memories": memories,
            "window_valid": window_valid, "cls_z": cls_z, "memory_z": memory_z}

  def _layer(self, name):
    cfg = self.config
    return EncoderLayer(cfg.d_model, cfg.num_heads, cfg.mlp_dim, cfg.dropout, cfg.rope_theta, cfg.norm_eps, name=name)


# ----------------------------------------------------------------------------- the family


def series_inputs(data_config):
  """A batch of one series of the data's length and channels (read from the training file)."""
  source = data.make_source(data_config, 0, "train")
  return (jnp.zeros((1,) + source.x.shape[1:], jnp.float32),)


def check_series(config):
  require(config.data.batch_size >= 2, "data.batch_size",
          f"contrastive pre-training needs >= 2 series per batch (the negatives), got {config.data.batch_size}")
  if config.data.seq_len:
    config.model.geometry(config.model.num_tokens(config.data.seq_len))


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


register(Family("pmt", PMTConfig, PMT, loss=pmt_loss, example_inputs=series_inputs,
                data_kinds=("series", "synthetic_series"), check=check_series, evaluator=SeriesEvaluator,
                mutable=("batch_stats",), rng_streams=("dropout",),
                throughput_unit="series", units_per_example=lambda config: 1, train_config_cls=PMTTrainConfig,
                no_decoding_reason="it is a time-series encoder (real-valued patches in, representations out), "
                                   "not a language model: there are no tokens to draw"))

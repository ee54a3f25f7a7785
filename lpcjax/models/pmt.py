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

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lpcjax import data
from lpcjax.evaluation.series import SeriesEvaluator
from lpcjax.layers.common import RMSNorm, normal_init
from lpcjax.layers.pma import EncoderLayer, PMAStack, masked_mean, window_tokens

from .family import Family
from .pmt_config import GATE_PATTERNS, PMTConfig, PMTTrainConfig  # noqa: F401  (re-exported)
from .pmt_losses import normalize, pmt_loss
from .table import register


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



register(Family("pmt", PMTConfig, PMT, loss=pmt_loss, example_inputs=series_inputs,
                evaluator=SeriesEvaluator,
                mutable=("batch_stats",), rng_streams=("dropout",),
                throughput_unit="series", units_per_example=lambda config: 1,
                no_decoding_reason="it is a time-series encoder (real-valued patches in, representations out), "
                                   "not a language model: there are no tokens to draw"))

"""The ``lpcsm`` family: LPC-SM (Local Predictive Coding and Sparse Memory), lpc-sm-spec.md.

Each block, in the order of spec §2 (norm -> local attention -> dual-timescale memory ->
predictive correction -> mHC), with a SwiGLU feed-forward last:

    h  = Σ_i pre_i(x) x_i, the pre-mix of the n streams          (mHC; n = 1 and x itself if off)
    a  = ForgettingAttention(norm(h))                            sliding window, RoPE, log f = 0
    r  = DualTimescaleMemory(norm(h + a))                        chunk summaries, fast + slow (ONT)
    ĥ  = W_p [a_{t-1}; r_t]                                      predict h_t from what came before
    e  = rms(h_t) − ĥ_t,  m = SparseController(e)                mismatch, sparse event mask
    c  = m_t · W_c e_t                                           W_c = 0 at init
    y  = a + r + c;  y += SwiGLU(norm(h + y))
    x_i <- Σ_j H_ij(x) x_j + post_i(x) y                         (mHC; plain x + y if off)

with x⁰ = n spread copies of the token (+ optionally position) embedding; then the readout (a
fixed weighted mean) of the streams, a final RMSNorm and two output heads: the LM head and the
stop head. Every choice the paper's lost equations leave open is a field of ``LPCSMConfig`` with the
reason beside it; the reusable layers are ``lpcjax.layers.mhc``, ``memory`` (with ``ont``),
``controller`` and the shared ``attention``.

Streaming: ``model.apply(variables, tokens, state=state)`` with ``init_state`` processes a
stream chunk by chunk (each call a multiple of ``chunk_size`` tokens) and returns (logits, new
state) equal to one parallel pass; the state holds each layer's attention window, fast and slow
memory, the controller's running statistics and the last attention output.
"""

import dataclasses
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from lpcjax.config import TrainConfig, check_scale_rules, require, require_choice
from lpcjax.decoding import prefill_by_steps
from lpcjax.layers.attention import AttentionConfig, ForgettingAttention, init_window_cache
from lpcjax.layers.common import Projection, RMSNorm, TokenEmbed, constant_init, dtype_of, normal_init
from lpcjax.layers.controller import ControllerConfig, SparseController, initial_stats
from lpcjax.layers.memory import DualTimescaleMemory, MemoryConfig, initial_chunk_inputs, initial_memory_state
from lpcjax.layers.mhc import MHC, MHCConfig, collapse_streams, expand_streams
from lpcjax.layers.mlp import MLPConfig, SwiGLU, swiglu_hidden_size
from lpcjax.losses import masked_cross_entropy, scored_positions

from .decoder import EMBED, lm_head, rematted, scanned_layers
from .decoder_config import DecoderConfig, GateFields, KVHeadFields, check_attention_impl
from .family import register
from .language_model import check_vocab, language_model_evaluator, language_model_family


@dataclasses.dataclass(frozen=True)
class LPCSMConfig(GateFields, KVHeadFields, DecoderConfig):
  """LPC-SM. Mechanism switches give the paper's ablations: ``mhc``, ``slow_memory``,
  ``predictive_coding``, ``ont``, ``stop_head`` (Stage A) and ``learn_ratio`` (Stage B's fixed
  ratio control). Sizes and rules marked NOT FOUND in lpc-sm-spec.md are chosen here."""

  family: ClassVar[str] = "lpcsm"

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
    check_attention_impl(self)

    require_choice(self.position_embedding, "model.position_embedding", {"sinusoidal", "none"})
    require_choice(self.summary_pool, "model.summary_pool", {"mean", "attention"})
    require(self.summary_init_std is None or self.summary_init_std >= 0, "model.summary_init_std",
            f"must be >= 0 or None, got {self.summary_init_std}")
    require_choice(self.controller_score, "model.controller_score", {"learned", "affine"})
    require_choice(self.mhc_pre_activation, "model.mhc_pre_activation", {"sigmoid", "softmax"})
    for name in ("mhc_post_spread", "mhc_pre_spread", "mhc_stream_spread"):
      require(0 <= getattr(self, name) < 1, f"model.{name}", "must be in [0, 1)")
    require(self.correction_init_std >= 0, "model.correction_init_std", "must be >= 0")

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


def sinusoidal_positions(positions, d, scale):
  """positions [...] int -> [..., d] float32: sin/cos pairs at wavelengths 2π · 10000^(2i/d)
  (Vaswani et al.), times ``scale`` · √2 so that the RMS over channels is ``scale``."""
  half = d // 2
  freq = jnp.exp(-jnp.log(10000.0) * jnp.arange(half, dtype=jnp.float32) / max(half, 1))
  angle = positions.astype(jnp.float32)[..., None] * freq
  table = jnp.concatenate([jnp.sin(angle), jnp.cos(angle)], axis=-1)
  table = jnp.pad(table, ((0, 0),) * (table.ndim - 1) + ((0, d - 2 * half),))
  return table * (scale * jnp.sqrt(2.0 * d / max(2 * half, 1)))


def rms_normalize(x, eps):
  """x / rms(x) over the last axis, no learned scale (the predictor's target)."""
  x = x.astype(jnp.float32)
  return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


class LPCSMBlock(nn.Module):
  """streams x [batch, seq, n, d] -> (streams, (new layer state or None, aux scalars))."""

  config: LPCSMConfig

  @nn.compact
  def __call__(self, x, state, position):
    cfg = self.config
    dtype, param_dtype = dtype_of(cfg.dtype), dtype_of(cfg.param_dtype)
    norm = lambda name: RMSNorm(eps=cfg.norm_eps, dtype=dtype, param_dtype=param_dtype, name=name)
    streaming = state is not None
    decoding = streaming and "chunk_inputs" in state  # one token per row (init_cache), else chunks
    new_state, aux = {}, {}
    mhc = MHC(cfg.mhc_config(), name="mhc") if cfg.mhc else None
    h = mhc.mix_in(x) if mhc else x[..., 0, :]

    attention = ForgettingAttention(cfg.attention_config(), name="attn")
    if streaming:
      a, new_state["attn"] = attention(norm("attn_norm")(h), cache=state["attn"], context={"position": position})
    else:
      a = attention(norm("attn_norm")(h))
    memory = DualTimescaleMemory(cfg.memory_config(), name="memory")
    if decoding:
      token = {"chunk_inputs": state["chunk_inputs"], "position": position[:, 0]}
      reads, (new_state["memory"], new_state["chunk_inputs"]) = memory(norm("memory_norm")(h + a), state["memory"],
                                                                       token)
    else:
      reads, new_state["memory"] = memory(norm("memory_norm")(h + a), state["memory"] if streaming else None)
    y = a + reads

    if cfg.predictive_coding:
      # ĥ_t from the local context up to t − 1 (the attention output one step back) and the
      # memory (chunks before t's): the prediction never sees token t itself.
      previous = state["prev_attn"][:, None] if streaming else jnp.zeros_like(a[:, :1])
      a_before = jnp.concatenate([previous.astype(a.dtype), a[:, :-1]], axis=1)
      predicted = Projection((cfg.d_model,), (None, "embed"), init_std=cfg.init_std, dtype=dtype,
                             param_dtype=param_dtype, name="predictor")(jnp.concatenate([a_before, reads], axis=-1))
      error = jax.lax.stop_gradient(rms_normalize(h, cfg.norm_eps)) - predicted.astype(jnp.float32)
      control = SparseController(cfg.controller_config(), name="controller")(
          error, state["controller"] if streaming else None)
      correction = Projection((cfg.d_model,), (None, "embed"), init_std=cfg.correction_init_std, dtype=dtype,
                              param_dtype=param_dtype, name="correction")(error)
      y = y + (control.mask[..., None] * correction).astype(y.dtype)
      new_state.update(controller=control.stats, prev_attn=a[:, -1])
      # per position [batch, seq] (mean over channels): the loss masks it with loss_mask
      aux = {"prediction_error": jnp.mean(jnp.square(error), axis=-1), "ratio_aux": control.aux,
             "sparse_ratio": control.ratio, "fire_rate": jnp.mean(jax.lax.stop_gradient(control.mask))}

    y = y + SwiGLU(cfg.mlp_config(), name="mlp")(norm("mlp_norm")(h + y))
    x = mhc.mix_out(x, y) if mhc else x + y[..., None, :]
    x = nn.with_logical_constraint(x, ("activation_batch", "activation_length", None, "activation_embed"))
    return x, (new_state if streaming else None, aux)


def init_state(config, batch):
  """The empty streaming state of an LPC-SM model for ``batch`` rows (see the module docstring)."""
  layer = {"attn": init_window_cache(config.attention_config(), batch),
           "memory": initial_memory_state(config.memory_config(), batch)}
  if config.predictive_coding:
    layer.update(controller=initial_stats(batch), prev_attn=jnp.zeros((batch, config.d_model), dtype_of(config.dtype)))
  stacked = jax.tree.map(lambda a: jnp.broadcast_to(a, (config.num_layers,) + a.shape), layer)
  return {"position": jnp.zeros((), jnp.int32), "layers": stacked}


def init_cache(config, batch, max_len=None):
  """The empty decoding cache of an LPC-SM model (``lpcjax.decoding``): one token per row per
  call. It is the streaming state (each layer's window of the last ``attention_window − 1``
  keys and values, fast and slow memory, controller statistics, last attention output) plus
  each layer's buffer of the current chunk's memory inputs, a position per row (rows of a batch
  sit at different positions) and the stop head's last logit per row. Its size does not grow
  with the sequence: ``max_len`` is not needed."""
  del max_len
  state = init_state(config, batch)
  buffer = initial_chunk_inputs(config.memory_config(), batch)
  layers = {**state["layers"], "chunk_inputs": jnp.broadcast_to(buffer, (config.num_layers,) + buffer.shape)}
  return {"position": jnp.zeros((batch,), jnp.int32), "layers": layers,
          "stop_logits": jnp.zeros((batch,), jnp.float32)}


class LPCSM(nn.Module):
  """tokens [batch, seq] -> logits [batch, seq, vocab] float32 (causal).

  ``return_aux=True``: (logits, extras) with the stop head's logits [batch, seq] and the
  auxiliary scalars averaged over layers (what ``lpcsm_loss`` needs). ``state`` (``init_state``):
  (logits, new state), streaming. seq must be a multiple of ``chunk_size``. ``state`` a decoding
  cache (``init_cache``): tokens [batch, 1], one token per row at its row's position; returns
  (logits [batch, 1, vocab], the cache advanced by one token, with the stop head's logit).
  """

  config: LPCSMConfig

  @nn.compact
  def __call__(self, tokens, segment_ids=None, state=None, return_aux=False):
    cfg = self.config
    if segment_ids is not None:
      raise ValueError("lpcsm does not take segment_ids: its chunked memories do not restart at document "
                       "boundaries (set data.segment_ids=false)")
    decoding = state is not None and "chunk_inputs" in state["layers"]
    if decoding and tokens.shape[1] != 1:
      raise ValueError(f"lpcsm: a decoding cache takes one token per row, got {tokens.shape[1]} "
                       "(lpcjax.decoding.prefill_by_steps feeds a prompt)")
    if not decoding and tokens.shape[1] % cfg.chunk_size:
      raise ValueError(f"lpcsm: sequence length {tokens.shape[1]} must be a multiple of "
                       f"model.chunk_size={cfg.chunk_size}")
    dtype, param_dtype = dtype_of(cfg.dtype), dtype_of(cfg.param_dtype)
    embed = TokenEmbed(cfg.vocab_size, cfg.d_model, dtype=dtype, param_dtype=param_dtype,
                       embedding_init=normal_init(cfg.init_std, ("vocab", "embed")), name="embed")
    position = jnp.zeros((), jnp.int32) if state is None else state["position"]
    if decoding:  # [batch, 1]: each row's own position, broadcast where a stream has one scalar
      position = position[:, None]
    h0 = embed(tokens)
    if cfg.position_embedding == "sinusoidal":
      positions = position + jnp.arange(tokens.shape[1])
      h0 = h0 + sinusoidal_positions(positions, cfg.d_model, cfg.init_std).astype(h0.dtype)
    spread = lambda value: value if cfg.mhc else 0.0
    x = expand_streams(nn.with_logical_constraint(h0, EMBED), cfg.streams, spread(cfg.mhc_stream_spread))
    blocks = scanned_layers(rematted(LPCSMBlock, cfg), cfg, (0, nn.broadcast))
    x, (layer_states, aux) = blocks(x, None if state is None else state["layers"], position)
    self.sow("intermediates", "streams", x)  # [batch, seq, n, d]: read by the tests of mHC
    logits, x = lm_head(collapse_streams(x, spread(cfg.mhc_pre_spread)), embed, cfg)
    extras = {name: jnp.mean(value, axis=0) for name, value in aux.items()}  # mean over layers
    if cfg.predictive_coding:  # and per layer [num_layers], for the logged trajectories
      extras["per_layer"] = {name: aux[name] for name in ("sparse_ratio", "fire_rate")}
    if cfg.stop_head:  # always built, so init creates its params
      extras["stop_logits"] = nn.Dense(1, dtype=jnp.float32, param_dtype=param_dtype,
                                       kernel_init=normal_init(cfg.init_std, ("embed", None)),
                                       bias_init=constant_init(0.0, (None,)), name="stop_head")(x)[..., 0]
    if decoding:
      stop = extras["stop_logits"][:, 0] if cfg.stop_head else state["stop_logits"]
      return logits, {"position": position[:, 0] + 1, "layers": layer_states, "stop_logits": stop}
    if state is not None:
      return logits, {"position": position + tokens.shape[1], "layers": layer_states}
    return (logits, extras) if return_aux else logits


def lpcsm_loss(apply_fn, params, batch, **_):
  """LM cross-entropy + weighted auxiliary losses (see LPCSMConfig). Metrics: ``loss`` (the
  total that is differentiated), ``lm_loss`` (the cross-entropy alone: the paper's "LM loss"
  and what runs are compared by), ``accuracy``, and each auxiliary term, the learned sparse
  ratio and the realised firing rate (means over layers, and per layer as ``*_layer<i>``)."""
  cfg = apply_fn.__self__.config
  logits, extras = apply_fn({"params": params}, batch["inputs"], segment_ids=batch.get("segment_ids"),
                            return_aux=True)
  mask = scored_positions(batch)
  losses, hits = masked_cross_entropy(logits, batch["targets"], mask)
  count = mask.sum()
  per_position = lambda total: total / jnp.maximum(count, 1.0)
  loss = per_position(losses.sum())
  metrics = {"lm_loss": (losses.sum(), count), "accuracy": (hits.sum(), count)}
  if cfg.stop_head:
    stop_target = (batch["targets"] == cfg.resolved_stop_token).astype(jnp.float32)
    stop = optax.sigmoid_binary_cross_entropy(extras["stop_logits"], stop_target)
    stop = (stop * mask).sum()
    loss = loss + cfg.stop_loss_weight * per_position(stop)
    metrics["stop_loss"] = (stop, count)
  if cfg.predictive_coding:
    # the predictor's squared error only where the LM loss is scored (padding is not a target)
    prediction = (extras["prediction_error"] * mask).sum()
    loss = loss + cfg.prediction_loss_weight * per_position(prediction) + cfg.ratio_loss_weight * extras["ratio_aux"]
    metrics["prediction_loss"] = (prediction, count)
    for name in ("ratio_aux", "sparse_ratio", "fire_rate"):
      metrics[name] = (extras[name].astype(jnp.float32), jnp.float32(1.0))
    for name, values in extras["per_layer"].items():  # sparse_ratio_layer0, fire_rate_layer0, ...
      for layer in range(cfg.num_layers):
        metrics[f"{name}_layer{layer}"] = (values[layer].astype(jnp.float32), jnp.float32(1.0))
  metrics["loss"] = (loss * count, count)
  return loss, metrics, {}


def chunk_padded_logits(model, params, inputs, segment_ids=None):
  """The evaluator's forward pass over any length: inputs [batch, T] are right-padded to a
  multiple of ``chunk_size`` and the padding's logits dropped (the model is causal, so padding
  after the last position cannot change an earlier logit)."""
  length = inputs.shape[1]
  padded = jnp.pad(inputs, ((0, 0), (0, -length % model.config.chunk_size)))
  return model.apply({"params": params}, padded, segment_ids=segment_ids)[:, :length]


def check_lpcsm(config):
  check_vocab(config)
  data, model = config.data, config.model
  require(data.seq_len % model.chunk_size == 0, "data.seq_len",
          f"{data.seq_len} must be a multiple of model.chunk_size={model.chunk_size} (the memories write whole chunks)")
  require(not getattr(data, "segment_ids", False), "data.segment_ids",
          "lpcsm's chunked memories do not restart at document boundaries; set data.segment_ids=false")


@dataclasses.dataclass(frozen=True)
class LPCSMTrainConfig(TrainConfig):
  """The trainer's settings plus LPC-SM's per-parameter learning-rate scales."""

  # "PATTERN=FACTOR": the updates of every parameter whose '/'-joined path (e.g.
  # layers/controller/ratio_logit) contains PATTERN are multiplied by FACTOR (the first matching
  # rule wins): the controller's learned sparse ratio must cross its range within a short stage.
  # Empty: the optimizer is exactly the shared one.
  lr_scales: tuple[str, ...] = ()

  def __post_init__(self):
    super().__post_init__()
    check_scale_rules(self.lr_scales, "train.lr_scales")

  def lr_scale_rules(self):
    return self.lr_scales


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


register(language_model_family("lpcsm", LPCSMConfig, LPCSM, loss=lpcsm_loss, check=check_lpcsm,
                               evaluator=language_model_evaluator(chunk_padded_logits),
                               init_cache=init_cache, prefill=prefill_by_steps,
                               train_config_cls=LPCSMTrainConfig, upgrade_saved=upgrade_saved_lpcsm))

"""The ``lpcsm`` family: LPC-SM (Local Predictive Coding and Sparse Memory), the LPC-SM spec.

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

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from lpcjax.decoding import GenerationError, prefill_by_steps
from lpcjax.layers.attention import ForgettingAttention, init_window_cache
from lpcjax.layers.common import Projection, RMSNorm, TokenEmbed, constant_init, dtype_of, normal_init
from lpcjax.layers.controller import SparseController, initial_stats
from lpcjax.layers.memory import DualTimescaleMemory, initial_chunk_inputs, initial_memory_state
from lpcjax.layers.mhc import MHC, collapse_streams, expand_streams
from lpcjax.layers.mlp import SwiGLU
from lpcjax.losses import masked_cross_entropy, scored_positions

from .decoder import EMBED, lm_head, rematted, scanned_layers
from .table import register
from .language_model import language_model_evaluator, language_model_family
from .lpcsm_config import LPCSMConfig, LPCSMTrainConfig, upgrade_saved_lpcsm  # noqa: F401  (LPCSMTrainConfig: re-exported)


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


# ----------------------------------------------------------------------------- the stop head in generation


@dataclasses.dataclass(frozen=True)
class StopHeadSays:
  """``stop_when`` of ``lpcjax.decoding.generate``: the rows whose stop head gives p(the document
  ends after their last token) > ``probability`` (hashable: it is a static argument of the jitted
  decoding loop)."""

  probability: float

  def __call__(self, cache):
    return jax.nn.sigmoid(cache["stop_logits"]) > self.probability


def stop_on_head(model, probability, end_token=None):
  """generate's keywords for ending a row on the stop head (``generate(..., **stop_on_head(model,
  0.5))``): ``stop_when`` and ``end_token`` (default: the model's ``stop_token``)."""
  if not model.config.stop_head:
    raise GenerationError("--stop-head: needs a model with a stop head; this lpcsm model was trained "
                          "without one (model.stop_head=false)")
  if not 0 < probability < 1:
    raise GenerationError(f"--stop-head: must be a probability in (0, 1), got {probability}")
  return {"stop_when": StopHeadSays(float(probability)),
          "end_token": model.config.resolved_stop_token if end_token is None else end_token}


class StopHeadRule:
  """LPC-SM's ``Family.stop_rule``: ``--stop-head P`` (off by default) also ends a row when the
  stop head's p(the text ends here) > P."""

  def add_arguments(self, parser):
    parser.add_argument("--stop-head", type=float, default=None, metavar="P",
                        help="lpcsm: also end a row when the stop head's p(text ends here) > P (default: off)")

  def resolve(self, model, options, end_token):
    if options.stop_head is None:
      return None, end_token
    rule = stop_on_head(model, options.stop_head, end_token)
    return rule["stop_when"], rule["end_token"]


register(language_model_family("lpcsm", LPCSMConfig, LPCSM, loss=lpcsm_loss,
                               evaluator=language_model_evaluator(chunk_padded_logits),
                               init_cache=init_cache, prefill=prefill_by_steps, stop_rule=StopHeadRule(),
                               upgrade_saved=upgrade_saved_lpcsm,
                               past_training_length=(
                                   "its MQAR recall was the same at 2x and 4x the training length as at 1x "
                                   "(23 / 24 / 21 %, 3 seeds; docs/mechanisms.md)")))

"""The one attention layer of the language models: multi-head causal attention, with or without a
forget gate, full or sliding-window, with RoPE, the Pro-block parts and two kinds of cache.

It serves the ``transformer`` family (no gate: log f = 0, exactly causal softmax attention), the
``fox`` family (Forgetting Attention) and LPC-SM's local attention (a sliding window with RoPE,
optionally FoX's gate). Pro-block parts, each switchable for the paper's ablations (FoX paper,
Sec. 3.2 and Table 3):

* KV-shift: k_t = a_t * k~_{t-1} + (1 - a_t) * k~_t with a_t = sigmoid(w . x_t) per head (no bias)
  and k~ = W_k x the unshifted candidate; the same for v with its own gate. It is applied to
  the projected k/v before QK-norm and restarts at every segment start (k~_{-1} = 0).
* QK-norm: RMSNorm over head_dim (eps 1e-5) on q and k; by default one scale shared by all
  heads, as in the released FoX checkpoints (``qk_norm_shared_scale``).
* Output norm and gate: o_proj(RMSNorm_head(o) * sigmoid(W_g x)), an RMSNorm over each head's
  head_dim channels with eps ``norm_eps``. Its scale always has one weight per channel of every
  head, shape (heads, head_dim), whatever ``qk_norm_shared_scale`` says: the official model's
  output norm is a group norm with hidden_size weights and shares nothing across heads, so this
  is the shape that represents its checkpoints.

Caches (both materialize the logits of the new tokens only, in float32; that decode-time math
sits beside the kernels, in ``lpcjax.kernels.decode``, and the cache layouts here):

* the decoding cache (``init_layer_cache``: every position up to ``max_len``), prefilled by the
  parallel pass over a prompt and then extended one token at a time (``lpcjax.decoding``);
* the window cache (``init_window_cache``: the last ``window − 1`` keys), for streaming a long
  sequence chunk by chunk (LPC-SM's ``init_state``); the outputs equal one parallel pass.

Grouped-query attention: ``num_kv_heads`` < ``num_heads`` projects k and v to fewer heads that
groups of consecutive query heads share (``lpcjax.kernels.gqa``); the kernels read the shared
head, nothing repeats K/V, and both caches store the key/value heads only. The forget gate stays
per query head (as in flash-linear-attention's FoX); KV-shift has one gate per key/value head,
and the QK-norm's per-head scales of k (``qk_norm_shared_scale=False``) are per key/value head.

The layer reads an ``AttentionConfig`` (the family configs build one with
``attention_config()``); in another model, give it the few fields that matter:

    attn = ForgettingAttention(AttentionConfig(d_model=512, num_heads=8, head_dim=64,
                                               use_rope=False, gate=GateConfig(num_heads=8)))
"""

import dataclasses
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from lpcjax.kernels import decay, forgetting_attention, segment_starts, sharded_forgetting_attention
from lpcjax.kernels.decode import cached_attention, window_chunk_attention
from lpcjax.sharding import attention_mesh_axes, shift_along_sequence

from .common import Projection, RMSNorm, dtype_of, normal_init
from .forget_gate import ForgetGate, GateConfig
from .rope import apply_rope, segment_positions

HEADS = ("activation_batch", "activation_length", "activation_heads", "activation_head_dim")


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
  """What ``ForgettingAttention`` and ``init_layer_cache`` read.

  * Sizes: ``d_model`` (input and output width), ``num_heads``, ``head_dim``, and
    ``num_kv_heads`` (None: ``num_heads``; fewer: grouped-query attention, it must divide
    ``num_heads``).
  * ``gate``: the forget gate (``GateConfig``, its num_heads = ``num_heads``), or None: no gate,
    log f = 0, exactly causal softmax attention (the ``transformer`` family).
  * ``use_rope``, ``rope_theta``: rotary embedding of q and k and its base.
  * Pro parts (module docstring), each a switch: ``use_qk_norm`` (with ``qk_norm_shared_scale``:
    one QK-norm scale for all heads), ``use_output_norm`` (eps ``norm_eps``),
    ``use_output_gate``, ``use_kv_shift``.
  * The op (``lpcjax.kernels.forgetting_attention``): ``window`` (sliding window; None: full
    causal), ``impl`` (backend), ``prune_epsilon`` (None: exact), ``debug`` (value checks).
  * ``init_std`` (std of every projection), ``dtype`` (compute) and ``param_dtype``, by name.
  """

  d_model: int
  num_heads: int
  head_dim: int
  num_kv_heads: Optional[int] = None
  gate: Optional[GateConfig] = None
  use_rope: bool = True
  rope_theta: float = 10000.0
  use_qk_norm: bool = False
  qk_norm_shared_scale: bool = True
  use_output_norm: bool = False
  use_output_gate: bool = False
  use_kv_shift: bool = False
  norm_eps: float = 1e-6
  window: Optional[int] = None
  impl: str = "auto"
  prune_epsilon: Optional[float] = None
  debug: bool = False
  init_std: float = 0.02
  dtype: str = "float32"
  param_dtype: str = "float32"

  def __post_init__(self):
    if self.kv_heads < 1 or self.num_heads % self.kv_heads:
      raise ValueError(f"AttentionConfig: num_kv_heads={self.num_kv_heads} must be >= 1 and divide "
                       f"num_heads={self.num_heads}")
    if self.gate is not None and self.gate.num_heads != self.num_heads:
      raise ValueError(f"AttentionConfig: gate.num_heads={self.gate.num_heads} != num_heads={self.num_heads}")
    if self.use_rope and self.head_dim % 2:
      raise ValueError(f"AttentionConfig: RoPE needs an even head_dim, got {self.head_dim}")

  @property
  def kv_heads(self):
    """The key/value heads: ``num_kv_heads``, or ``num_heads`` when it is None."""
    return self.num_heads if self.num_kv_heads is None else self.num_kv_heads


class KVShift(nn.Module):
  """Data-dependent token shift of one projected stream ([batch, seq, heads, head_dim]), one
  gate per head, its weight ~ N(0, ``init_std``)."""

  num_heads: int
  init_std: float = 0.02

  @nn.compact
  def __call__(self, x, candidate, segment_ids=None, previous=None):
    """x [batch, seq, d_model], candidate [batch, seq, heads, head_dim] -> the same shape.

    ``previous`` [batch, heads, head_dim]: the candidate before ``candidate``'s first token
    (cached decoding); None: zeros before the sequence and at every segment start."""
    alpha = nn.Dense(self.num_heads, use_bias=False, dtype=jnp.float32, param_dtype=jnp.float32,
                     kernel_init=normal_init(self.init_std, ("embed", "heads")), name="gate")(
                         x.astype(jnp.float32))
    alpha = jax.nn.sigmoid(alpha)[..., None]  # [batch, seq, heads, 1]
    first = jnp.zeros_like(candidate[:, :1]) if previous is None else previous[:, None].astype(candidate.dtype)
    previous = shift_along_sequence(candidate, first, HEADS)
    if segment_ids is not None:  # nothing shifts across a document boundary
      previous = jnp.where(segment_starts(segment_ids)[:, :, None, None], 0, previous)
    shifted = alpha * previous.astype(jnp.float32) + (1 - alpha) * candidate.astype(jnp.float32)
    return shifted.astype(candidate.dtype)


class ForgettingAttention(nn.Module):
  """x [batch, seq, d_model] -> [batch, seq, d_model], configured by an ``AttentionConfig``."""

  config: AttentionConfig

  @nn.compact
  def __call__(self, x, segment_ids=None, cache=None, context=None):
    """Without ``cache``: the parallel pass, x [batch, seq, d_model] -> [batch, seq, d_model];
    segment_ids [batch, seq] int (optional): packed documents, nothing crosses a change of id.

    With a decoding cache (``init_layer_cache``; see ``lpcjax.decoding``): returns (output,
    updated cache); x is either the whole right-padded prompt (the cache is empty: the parallel
    kernel runs and fills it) or one new token per row [batch, 1, d_model], at position
    ``context["lengths"]`` [batch], attending over the cache (``context`` as below).

    With a window cache (``init_window_cache``): returns (output, rolled cache); x is the next
    chunk of a stream whose first token sits at ``context["position"]`` (a scalar)."""
    cfg = self.config
    heads, kv_heads, head_dim = cfg.num_heads, cfg.kv_heads, cfg.head_dim
    dtype, param_dtype = dtype_of(cfg.dtype), dtype_of(cfg.param_dtype)

    def project(name, count=heads):
      return Projection((count, head_dim), ("embed", "heads", "head_dim"), init_std=cfg.init_std,
                        dtype=dtype, param_dtype=param_dtype, name=name)(x)

    def head_norm(name, eps, shared, count=heads):
      shape = (head_dim,) if shared else (count, head_dim)
      axes = ("head_dim",) if shared else ("heads", "head_dim")
      return RMSNorm(eps=eps, dtype=dtype, param_dtype=param_dtype, scale_axes=axes,
                     scale_shape=shape, name=name)

    streaming = cache is not None and is_window_cache(cache)
    decoding = cache is not None and not streaming and x.shape[1] == 1
    if streaming and (cfg.use_kv_shift or segment_ids is not None):
      raise ValueError("a window cache streams one unsegmented stream without KV-shift")
    q, k, v = project("q_proj"), project("k_proj", kv_heads), project("v_proj", kv_heads)
    candidates = (k, v)  # KV-shift state: the unshifted projections
    if cfg.use_kv_shift:
      shift = lambda name: KVShift(kv_heads, cfg.init_std, name=name)
      k = shift("k_shift")(x, k, segment_ids, cache["k_prev"] if decoding else None)
      v = shift("v_shift")(x, v, segment_ids, cache["v_prev"] if decoding else None)
    if cfg.use_qk_norm:
      shared = cfg.qk_norm_shared_scale
      q, k = head_norm("q_norm", 1e-5, shared)(q), head_norm("k_norm", 1e-5, shared, kv_heads)(k)
    if cfg.use_rope:
      if decoding:
        positions = (context["lengths"] - context["rope_start"])[:, None]
      elif streaming:  # keys are cached after RoPE at their absolute stream positions
        positions = context["position"] + jnp.arange(x.shape[1], dtype=jnp.int32)[None, :]
      else:
        positions = segment_positions(segment_ids, x.shape[1])
      q, k = apply_rope(q, positions, cfg.rope_theta), apply_rope(k, positions, cfg.rope_theta)
    q, k, v = (nn.with_logical_constraint(t, HEADS) for t in (q, k, v))

    if cfg.gate is None:
      # No gate: log f = 0. The barrier keeps XLA from constant-folding the decay's cumulative
      # sums over a constant (seconds of compile time per step at batch 32 x 128, a quarter of
      # the Transformer's compile; measured); at run time they are a few cheap scans.
      log_fgate = jax.lax.optimization_barrier(jnp.zeros(x.shape[:2] + (heads,), jnp.float32))
    else:
      log_fgate = ForgetGate(cfg.gate, name="forget_gate")(x)
    if decoding:
      o, cache = cached_attention(q, k, v, log_fgate, cache, context, cfg.window, constrain=_constrained)
    elif streaming:
      o, cache = window_chunk_attention(q, k, v, log_fgate, cache)
    else:
      options = dict(segment_ids=segment_ids, impl=cfg.impl, debug=cfg.debug,
                     prune_epsilon=cfg.prune_epsilon, window=cfg.window)
      # checkify (debug) cannot transform shard_map: debug runs leave attention to GSPMD.
      # (the key/value heads decide: they divide the query heads, and each device holds whole groups)
      placement = None if cfg.debug else attention_mesh_axes(x.shape[0], kv_heads)
      if placement is None:
        o = forgetting_attention(q, k, v, log_fgate, **options)
      else:  # a pallas_call cannot be partitioned by GSPMD: run it per (batch, head) shard,
        # and a sequence-sharded input over the ring of context_parallel.py
        mesh, batch_axes, head_axes, context_axis = placement
        o = sharded_forgetting_attention(q, k, v, log_fgate, mesh=mesh, batch_axes=batch_axes,
                                         head_axes=head_axes, context_axis=context_axis, **options)
      if cache is not None:
        cache = prefilled_cache(cache, k, v, log_fgate, context)
    if cache is not None and cfg.use_kv_shift:  # (never streaming: checked above)
      cache = {**cache, **last_candidates(candidates, context["lengths"], decoding)}

    if cfg.use_output_norm:
      o = head_norm("o_norm", cfg.norm_eps, shared=False)(o)
    if cfg.use_output_gate:
      o = o * jax.nn.sigmoid(project("g_proj").astype(jnp.float32)).astype(o.dtype)
    out = Projection((cfg.d_model,), ("heads", "head_dim", "embed"), in_ndim=2, init_std=cfg.init_std,
                     dtype=dtype, param_dtype=param_dtype, name="o_proj")(o)
    return out if cache is None else (out, cache)


# ----------------------------------------------------------------------------- cached decoding
# A layer's cache: k, v [batch, max_len, kv_heads, head_dim] (after KV-shift, QK-norm and RoPE;
# the key/value heads only, G times fewer than the query heads with grouped-query attention), with
# a forget gate c [batch, max_len, heads] float32 (per query head) = cumsum of log f over the row (c_i - c_j is
# the decay between two positions of one segment; without a gate it is 0 and not stored) with
# its low part c_lo (c = c + c_lo exactly, lpcjax.kernels.decay: a float32 c alone would put
# an error of ~1e-3 into every decay at |c| ~ 4e4), and
# with KV-shift the last unshifted k, v [batch, kv_heads, head_dim]. The model's ``context`` gives
# each row's ``lengths`` (prefill: the prompt length;
# decoding: the new token's position), ``rope_start`` and ``segments`` [batch, max_len].

CACHE_AXES = ("activation_batch", "activation_length", "activation_heads", "activation_head_dim")


def init_layer_cache(cfg, batch, max_len):
  """An empty cache (zeros, in the compute dtype) for one ``ForgettingAttention(cfg)`` layer,
  cfg an ``AttentionConfig``."""
  heads, kv_heads, head_dim, dtype = cfg.num_heads, cfg.kv_heads, cfg.head_dim, dtype_of(cfg.dtype)
  cache = {"k": jnp.zeros((batch, max_len, kv_heads, head_dim), dtype),
           "v": jnp.zeros((batch, max_len, kv_heads, head_dim), dtype)}
  if cfg.gate is not None:
    cache["c"] = jnp.zeros((batch, max_len, heads), jnp.float32)
    cache["c_lo"] = jnp.zeros((batch, max_len, heads), jnp.float32)
  if cfg.use_kv_shift:
    cache.update(k_prev=jnp.zeros((batch, kv_heads, head_dim), dtype),
                 v_prev=jnp.zeros((batch, kv_heads, head_dim), dtype))
  return cache


def _constrained(cache):
  return {**cache, "k": nn.with_logical_constraint(cache["k"], CACHE_AXES),
          "v": nn.with_logical_constraint(cache["v"], CACHE_AXES)}


def prefilled_cache(cache, k, v, log_fgate, context):
  """The empty cache with the prompt's k, v and c at positions [0, prompt_len)."""
  length = k.shape[1]
  cache = {**cache, "k": cache["k"].at[:, :length].set(k.astype(cache["k"].dtype)),
           "v": cache["v"].at[:, :length].set(v.astype(cache["v"].dtype))}
  if "c" in cache:
    c = decay.cumsum(log_fgate, axis=1)
    cache["c"] = cache["c"].at[:, :length].set(c.hi)
    cache["c_lo"] = cache["c_lo"].at[:, :length].set(c.lo)
  return _constrained(cache)


def last_candidates(candidates, lengths, decoding):
  """KV-shift state after this call: the unshifted k, v of each row's last token."""
  k, v = candidates
  if decoding:
    return {"k_prev": k[:, 0], "v_prev": v[:, 0]}
  index = (lengths - 1)[:, None, None, None]
  return {"k_prev": jnp.take_along_axis(k, index, axis=1)[:, 0], "v_prev": jnp.take_along_axis(v, index, axis=1)[:, 0]}


# ----------------------------------------------------------------------------- streaming windows
# A window cache: the last window − 1 keys and values of the stream (after RoPE at their
# absolute positions), their c (cumulative log f of the stream, float32, with its low part c_lo
# as in the decoding cache; zeros without a gate), whether each slot holds a real token yet, and
# the stream's running c after its last token (c_last, c_last_lo).


def init_window_cache(cfg, batch):
  """An empty window cache of ``ForgettingAttention(cfg)`` (``cfg.window`` set) for ``batch``
  streams."""
  if cfg.window is None:
    raise ValueError("a window cache needs AttentionConfig.window")
  size, dtype = cfg.window - 1, dtype_of(cfg.dtype)
  return {"k": jnp.zeros((batch, size, cfg.kv_heads, cfg.head_dim), dtype),
          "v": jnp.zeros((batch, size, cfg.kv_heads, cfg.head_dim), dtype),
          "c": jnp.zeros((batch, size, cfg.num_heads), jnp.float32),
          "c_lo": jnp.zeros((batch, size, cfg.num_heads), jnp.float32),
          "valid": jnp.zeros((batch, size), bool), "c_last": jnp.zeros((batch, cfg.num_heads), jnp.float32),
          "c_last_lo": jnp.zeros((batch, cfg.num_heads), jnp.float32)}


def is_window_cache(cache):
  return "valid" in cache

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
sits beside the kernels, in ``lpcjax.kernels.decode``, and the cache layouts and updates in
``lpcjax.layers.attention_cache``, whose names this module re-exports):

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

import flax.linen as nn
import jax
import jax.numpy as jnp

from lpcjax.kernels import forgetting_attention, segment_starts, sharded_forgetting_attention
from lpcjax.kernels.decode import cached_attention, window_chunk_attention
from lpcjax.sharding import attention_mesh_axes, shift_along_sequence

from .attention_cache import (CACHE_AXES, constrained, init_layer_cache, init_window_cache, is_window_cache,
                              last_candidates, prefilled_cache)
from .common import Projection, RMSNorm, dtype_of, normal_init
from .configs import AttentionConfig  # noqa: F401  (re-exported: the layer's config)
from .forget_gate import ForgetGate
from .rope import apply_rope, segment_positions

__all__ = ["CACHE_AXES", "HEADS", "AttentionConfig", "ForgettingAttention", "KVShift", "cached_attention",
           "init_layer_cache", "init_window_cache", "is_window_cache", "last_candidates", "prefilled_cache",
           "window_chunk_attention"]

HEADS = ("activation_batch", "activation_length", "activation_heads", "activation_head_dim")


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
  """x [batch, seq, d_model] -> [batch, seq, d_model], configured by an ``AttentionConfig``.

  Four short paths over one projection step (``_project``: q/k/v projections, forget gate,
  KV-shift, QK-norm, RoPE) and one output step (``_output``: output norm and gate, o_proj):

  * ``_train``: the parallel pass, no cache;
  * ``_prefill``: the parallel pass over a prompt, which fills an empty decoding cache;
  * ``_decode``: one token per row against the decoding cache;
  * ``_stream``: the next chunk of a stream against a window cache. It is a path of its own, not
    part of ``_decode``: a chunk has any length (not one token), the cache has another layout
    and rolls instead of growing, RoPE counts from the stream's position, and there is no
    KV-shift or segment to carry; sharing ``_decode`` would bring those branches back.

  The caches' layouts and updates sit in ``lpcjax.layers.attention_cache``.
  """

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
    if cache is None:
      return self._train(x, segment_ids)
    if is_window_cache(cache):
      return self._stream(x, segment_ids, cache, context)
    if x.shape[1] == 1:
      return self._decode(x, cache, context)
    return self._prefill(x, segment_ids, cache, context)

  # --------------------------------------------------------------------------- the paths

  def _train(self, x, segment_ids):
    """The parallel pass over packed documents."""
    q, k, v, log_fgate, _ = self._project(x, lambda: segment_positions(segment_ids, x.shape[1]), segment_ids)
    return self._output(x, self._parallel_attention(q, k, v, log_fgate, segment_ids))

  def _prefill(self, x, segment_ids, cache, context):
    """The parallel pass over a right-padded prompt; its k, v, c (and KV-shift state) fill the
    empty decoding cache."""
    q, k, v, log_fgate, candidates = self._project(x, lambda: segment_positions(segment_ids, x.shape[1]),
                                                   segment_ids)
    o = self._parallel_attention(q, k, v, log_fgate, segment_ids)
    cache = prefilled_cache(cache, k, v, log_fgate, context)
    if self.config.use_kv_shift:
      cache = {**cache, **last_candidates(candidates, context["lengths"], decoding=False)}
    return self._output(x, o), cache

  def _decode(self, x, cache, context):
    """One new token per row at position ``context["lengths"]``, over the decoding cache."""
    cfg = self.config
    q, k, v, log_fgate, candidates = self._project(
        x, lambda: (context["lengths"] - context["rope_start"])[:, None],
        previous=(cache.get("k_prev"), cache.get("v_prev")))
    o, cache = cached_attention(q, k, v, log_fgate, cache, context, cfg.window, constrain=constrained)
    if cfg.use_kv_shift:
      cache = {**cache, **last_candidates(candidates, context["lengths"], decoding=True)}
    return self._output(x, o), cache

  def _stream(self, x, segment_ids, cache, context):
    """The next chunk of one stream over the window cache; the outputs equal one parallel pass."""
    if self.config.use_kv_shift or segment_ids is not None:
      raise ValueError("a window cache streams one unsegmented stream without KV-shift")
    # keys are cached after RoPE at their absolute stream positions
    positions = lambda: context["position"] + jnp.arange(x.shape[1], dtype=jnp.int32)[None, :]
    q, k, v, log_fgate, _ = self._project(x, positions)
    o, cache = window_chunk_attention(q, k, v, log_fgate, cache)
    return self._output(x, o), cache

  # --------------------------------------------------------------------------- shared steps

  def _project(self, x, rope_positions, segment_ids=None, previous=(None, None)):
    """The projection step: (q, k, v, log f, candidates). q, k, v are after KV-shift (with the
    candidates ``previous`` before the first token, None: zeros), QK-norm and RoPE at
    ``rope_positions()`` (called only with RoPE); log f [batch, seq, heads] float32 is the forget
    gate's; candidates are the unshifted k, v (the KV-shift state a decoding cache keeps)."""
    cfg = self.config
    q, k, v = self._dense(x, "q_proj"), self._dense(x, "k_proj", cfg.kv_heads), self._dense(x, "v_proj", cfg.kv_heads)
    candidates = (k, v)
    if cfg.use_kv_shift:
      k = KVShift(cfg.kv_heads, cfg.init_std, name="k_shift")(x, k, segment_ids, previous[0])
      v = KVShift(cfg.kv_heads, cfg.init_std, name="v_shift")(x, v, segment_ids, previous[1])
    if cfg.use_qk_norm:
      shared = cfg.qk_norm_shared_scale
      q, k = self._head_norm("q_norm", 1e-5, shared)(q), self._head_norm("k_norm", 1e-5, shared, cfg.kv_heads)(k)
    if cfg.use_rope:
      positions = rope_positions()
      q, k = apply_rope(q, positions, cfg.rope_theta), apply_rope(k, positions, cfg.rope_theta)
    q, k, v = (nn.with_logical_constraint(t, HEADS) for t in (q, k, v))
    if cfg.gate is None:
      # No gate: log f = 0. The barrier keeps XLA from constant-folding the decay's cumulative
      # sums over a constant (seconds of compile time per step at batch 32 x 128, a quarter of
      # the Transformer's compile; measured); at run time they are a few cheap scans.
      log_fgate = jax.lax.optimization_barrier(jnp.zeros(x.shape[:2] + (cfg.num_heads,), jnp.float32))
    else:
      log_fgate = ForgetGate(cfg.gate, name="forget_gate")(x)
    return q, k, v, log_fgate, candidates

  def _parallel_attention(self, q, k, v, log_fgate, segment_ids):
    """The parallel kernel (``forgetting_attention``), per shard where the mesh splits it."""
    cfg = self.config
    options = dict(segment_ids=segment_ids, impl=cfg.impl, debug=cfg.debug,
                   prune_epsilon=cfg.prune_epsilon, window=cfg.window)
    # checkify (debug) cannot transform shard_map: debug runs leave attention to GSPMD.
    # (the key/value heads decide: they divide the query heads, and each device holds whole groups)
    placement = None if cfg.debug else attention_mesh_axes(q.shape[0], cfg.kv_heads)
    if placement is None:
      return forgetting_attention(q, k, v, log_fgate, **options)
    # a pallas_call cannot be partitioned by GSPMD: run it per (batch, head) shard, and a
    # sequence-sharded input over the ring of context_parallel.py
    mesh, batch_axes, head_axes, context_axis = placement
    return sharded_forgetting_attention(q, k, v, log_fgate, mesh=mesh, batch_axes=batch_axes,
                                        head_axes=head_axes, context_axis=context_axis, **options)

  def _output(self, x, o):
    """The output step: o [batch, seq, heads, head_dim] -> o_proj(norm(o) * gate(x))."""
    cfg = self.config
    if cfg.use_output_norm:
      o = self._head_norm("o_norm", cfg.norm_eps, shared=False)(o)
    if cfg.use_output_gate:
      o = o * jax.nn.sigmoid(self._dense(x, "g_proj").astype(jnp.float32)).astype(o.dtype)
    return Projection((cfg.d_model,), ("heads", "head_dim", "embed"), in_ndim=2, init_std=cfg.init_std,
                      dtype=dtype_of(cfg.dtype), param_dtype=dtype_of(cfg.param_dtype), name="o_proj")(o)

  def _dense(self, x, name, count=None):
    """x [batch, seq, d_model] -> [batch, seq, count (None: num_heads), head_dim]."""
    cfg = self.config
    return Projection((count or cfg.num_heads, cfg.head_dim), ("embed", "heads", "head_dim"),
                      init_std=cfg.init_std, dtype=dtype_of(cfg.dtype), param_dtype=dtype_of(cfg.param_dtype),
                      name=name)(x)

  def _head_norm(self, name, eps, shared, count=None):
    """An RMSNorm over head_dim: one scale (``shared``) or one per head (count, None: num_heads)."""
    cfg = self.config
    shape = (cfg.head_dim,) if shared else (count or cfg.num_heads, cfg.head_dim)
    axes = ("head_dim",) if shared else ("heads", "head_dim")
    return RMSNorm(eps=eps, dtype=dtype_of(cfg.dtype), param_dtype=dtype_of(cfg.param_dtype), scale_axes=axes,
                   scale_shape=shape, name=name)

"""Decoder-only language model shared by the ``transformer`` and ``fox`` families.

Pre-norm blocks x += attn(RMSNorm(x)); x += SwiGLU(RMSNorm(x)), stacked with ``nn.scan`` (one
compiled block whatever the depth; params get a leading "layers" axis) and wrapped in
``nn.remat`` with the policy named in the config. With a cache (``init_cache``) the same model
prefills a prompt and decodes one token at a time (``lpcjax.decoding``).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from lpcjax.layers import ForgettingAttention, RMSNorm, SwiGLU, segment_positions
from lpcjax.layers.attention import init_layer_cache
from lpcjax.layers.common import TokenEmbed, dtype_of, normal_init

from .decoder_config import REMAT_POLICY_NAMES

# model.remat_policy (decoder_config.REMAT_POLICY_NAMES) -> what nn.remat keeps for the backward
REMAT_POLICIES = dict(zip(REMAT_POLICY_NAMES, (None, jax.checkpoint_policies.nothing_saveable,
                                               jax.checkpoint_policies.checkpoint_dots,
                                               jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims)))

EMBED = ("activation_batch", "activation_length", "activation_embed")

LOGITS = ("activation_batch", "activation_length", "activation_vocab")


class DecoderBlock(nn.Module):
  """x [batch, seq, d_model] -> (x, the layer's updated cache or None)."""

  config: object

  @nn.compact
  def __call__(self, x, segment_ids, cache=None, context=None):
    cfg = self.config
    norm = lambda name: RMSNorm(eps=cfg.norm_eps, dtype=dtype_of(cfg.dtype),
                                param_dtype=dtype_of(cfg.param_dtype), name=name)
    attention = ForgettingAttention(cfg.attention_config(), name="attn")
    attended = attention(norm("attn_norm")(x), segment_ids, cache, context)
    if cache is not None:
      attended, cache = attended
    x = x + attended
    x = x + SwiGLU(cfg.mlp_config(), name="mlp")(norm("mlp_norm")(x))
    return nn.with_logical_constraint(x, EMBED), cache


def lm_head(x, embed, cfg):
  """The LM head of every decoder family: (logits [batch, seq, vocab] float32, the normed x).

  A final RMSNorm ("final_norm"), then the embedding table (``cfg.tie_embeddings``) or an
  untied projection ("lm_head"). Call it inside the model's compact ``__call__``: its params
  are the model's own ("final_norm", "lm_head"), not a submodule's."""
  dtype, param_dtype = dtype_of(cfg.dtype), dtype_of(cfg.param_dtype)
  x = RMSNorm(eps=cfg.norm_eps, dtype=dtype, param_dtype=param_dtype, name="final_norm")(x)
  if cfg.tie_embeddings:
    logits = embed.attend(x)
  else:
    logits = nn.Dense(cfg.vocab_size, use_bias=False, dtype=dtype, param_dtype=param_dtype,
                      kernel_init=normal_init(cfg.init_std, ("embed", "vocab")), name="lm_head")(x)
  return nn.with_logical_constraint(logits.astype(jnp.float32), LOGITS), x


def rematted(block, cfg):
  """``block`` under ``nn.remat`` with ``cfg.remat_policy`` ("none": as is)."""
  if cfg.remat_policy == "none":
    return block
  # Under scan, CSE cannot merge the recomputation with the forward pass, so it can stay off.
  return nn.remat(block, policy=REMAT_POLICIES[cfg.remat_policy], prevent_cse=not cfg.scan_layers)


def scanned_layers(block, cfg, in_axes, name="layers"):
  """``cfg.num_layers`` copies of ``block`` as one ``nn.scan`` (params get a leading "layers"
  axis); the block maps (carry, *inputs) -> (carry, outputs), inputs split by ``in_axes``."""
  # No constancy check: it re-traces the body to test broadcast outputs (there are none), and
  # under checkify (model.debug_checks) newer JAX makes it see a false dependency.
  scanned = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True}, in_axes=in_axes,
                    length=cfg.num_layers, metadata_params={nn.PARTITION_NAME: "layers"},
                    check_constancy_invariants=False)
  return scanned(cfg, name=name)


def stacked_blocks(cfg, name="layers"):
  """cfg.num_layers DecoderBlocks; call as ``x, caches = stack(x, segment_ids, caches, context)``
  (caches: None, or each layer's cache stacked on a leading axis)."""
  block = rematted(DecoderBlock, cfg)
  if not cfg.scan_layers:
    return _Unrolled(cfg, block, name=name)
  return scanned_layers(block, cfg, (nn.broadcast, 0, nn.broadcast), name)


class _Unrolled(nn.Module):
  config: object
  block: type

  @nn.compact
  def __call__(self, x, segment_ids, caches=None, context=None):
    new = []
    for i in range(self.config.num_layers):
      layer_cache = None if caches is None else jax.tree.map(lambda a, i=i: a[i], caches)
      x, layer_cache = self.block(self.config, name=f"block_{i}")(x, segment_ids, layer_cache, context)
      new.append(layer_cache)
    return x, None if caches is None else jax.tree.map(lambda *a: jnp.stack(a), *new)


def init_cache(cfg, batch, max_len):
  """An empty decoding cache of a transformer/fox model for ``batch`` rows of up to ``max_len``
  tokens: per layer (stacked) the attention cache (``lpcjax.layers.attention``), and per row
  the number of tokens so far (``lengths``), the position where its current segment started
  (``rope_start``: RoPE and KV-shift restart there) and every position's segment id."""
  layer = init_layer_cache(cfg.attention_config(), batch, max_len)
  return {"layers": jax.tree.map(lambda a: jnp.broadcast_to(a, (cfg.num_layers,) + a.shape), layer),
          "lengths": jnp.zeros((batch,), jnp.int32), "rope_start": jnp.zeros((batch,), jnp.int32),
          "segments": jnp.zeros((batch, max_len), jnp.int32)}


def decoding_context(cache, tokens, segment_ids):
  """(context for the layers, the cache's row state after this call).

  Prefill (tokens [batch, P], the cache empty, ``cache["lengths"]`` = each row's prompt length;
  the prompt is right-padded): positions [0, P) take the prompt's segment ids; the row's current
  segment is that of its last prompt token. Decoding (one token per row): the token continues
  its row's current segment at position ``lengths``.
  """
  lengths, max_len = cache["lengths"], cache["segments"].shape[1]
  if tokens.shape[1] > 1:
    prompt_len = tokens.shape[1]
    segment_ids = jnp.zeros(tokens.shape, jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)
    segments = cache["segments"].at[:, :prompt_len].set(segment_ids)
    last = (lengths - 1)[:, None]
    offset = jnp.take_along_axis(segment_positions(segment_ids, prompt_len), last, axis=1)[:, 0]
    rope_start, new_lengths = lengths - 1 - offset, lengths
  else:
    current = jnp.take_along_axis(cache["segments"], jnp.maximum(lengths - 1, 0)[:, None], axis=1)
    segments = jnp.where(jnp.arange(max_len)[None, :] == lengths[:, None], current, cache["segments"])
    rope_start, new_lengths = cache["rope_start"], lengths + 1
  context = {"lengths": lengths, "rope_start": rope_start, "segments": segments}
  return context, {"lengths": new_lengths, "rope_start": rope_start, "segments": segments}


class DecoderLM(nn.Module):
  """tokens [batch, seq] int -> logits [batch, seq, vocab] float32 (causal).

  segment_ids [batch, seq] (optional) separate packed documents: no attention, decay, KV-shift
  or RoPE offset crosses a change of id.
  """

  config: object

  @nn.compact
  def __call__(self, tokens, segment_ids=None, cache=None):
    """With ``cache`` (``init_cache``; see ``decoding_context`` for the two ways to call it):
    returns (logits, updated cache)."""
    cfg = self.config
    dtype, param_dtype = dtype_of(cfg.dtype), dtype_of(cfg.param_dtype)
    embed = TokenEmbed(cfg.vocab_size, cfg.d_model, dtype=dtype, param_dtype=param_dtype,
                     embedding_init=normal_init(cfg.init_std, ("vocab", "embed")), name="embed")
    x = nn.with_logical_constraint(embed(tokens), EMBED)
    if cache is None:
      x, _ = stacked_blocks(cfg)(x, segment_ids, None, None)
    else:
      context, row_state = decoding_context(cache, tokens, segment_ids)
      x, layers = stacked_blocks(cfg)(x, segment_ids if tokens.shape[1] > 1 else None, cache["layers"], context)
      cache = {**row_state, "layers": layers}
    logits, _ = lm_head(x, embed, cfg)
    return logits if cache is None else (logits, cache)

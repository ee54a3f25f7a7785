"""Decoder-only language model shared by the ``transformer`` and ``fox`` families.

Pre-norm blocks x += attn(RMSNorm(x)); x += SwiGLU(RMSNorm(x)), stacked with ``nn.scan`` (one
compiled block whatever the depth; params get a leading "layers" axis) and wrapped in
``nn.remat`` with the policy named in the config.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from lpcjax.layers import ForgettingAttention, RMSNorm, SwiGLU
from lpcjax.layers.common import TokenEmbed, dtype_of, normal_init

EMBED = ("activation_batch", "activation_length", "activation_embed")

REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


class DecoderBlock(nn.Module):
  config: object

  @nn.compact
  def __call__(self, x, segment_ids):
    cfg = self.config
    norm = lambda name: RMSNorm(eps=cfg.norm_eps, dtype=dtype_of(cfg.dtype),
                                param_dtype=dtype_of(cfg.param_dtype), name=name)
    x = x + ForgettingAttention(cfg, name="attn")(norm("attn_norm")(x), segment_ids)
    x = x + SwiGLU(cfg, name="mlp")(norm("mlp_norm")(x))
    return nn.with_logical_constraint(x, EMBED), None


def stacked_blocks(cfg, name="layers"):
  """cfg.num_layers DecoderBlocks; call as ``x, _ = stack(x, segment_ids)``."""
  block = DecoderBlock
  if cfg.remat_policy != "none":
    # Under scan, CSE cannot merge the recomputation with the forward pass, so it can stay off.
    block = nn.remat(block, policy=REMAT_POLICIES[cfg.remat_policy], prevent_cse=not cfg.scan_layers)
  if not cfg.scan_layers:
    return _Unrolled(cfg, block, name=name)
  # No constancy check: it re-traces the body to test broadcast outputs (there are none), and
  # under checkify (model.debug_checks) newer JAX makes it see a false dependency.
  scanned = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True},
                    in_axes=(nn.broadcast,), length=cfg.num_layers,
                    metadata_params={nn.PARTITION_NAME: "layers"}, check_constancy_invariants=False)
  return scanned(cfg, name=name)


class _Unrolled(nn.Module):
  config: object
  block: type

  @nn.compact
  def __call__(self, x, segment_ids):
    for i in range(self.config.num_layers):
      x, _ = self.block(self.config, name=f"block_{i}")(x, segment_ids)
    return x, None


class DecoderLM(nn.Module):
  """tokens [batch, seq] int -> logits [batch, seq, vocab] float32 (causal).

  segment_ids [batch, seq] (optional) separate packed documents: no attention, decay, KV-shift
  or RoPE offset crosses a change of id.
  """

  config: object

  @nn.compact
  def __call__(self, tokens, segment_ids=None):
    cfg = self.config
    dtype, param_dtype = dtype_of(cfg.dtype), dtype_of(cfg.param_dtype)
    embed = TokenEmbed(cfg.vocab_size, cfg.d_model, dtype=dtype, param_dtype=param_dtype,
                     embedding_init=normal_init(cfg.init_std, ("vocab", "embed")), name="embed")
    x = nn.with_logical_constraint(embed(tokens), EMBED)
    x, _ = stacked_blocks(cfg)(x, segment_ids)
    x = RMSNorm(eps=cfg.norm_eps, dtype=dtype, param_dtype=param_dtype, name="final_norm")(x)
    if cfg.tie_embeddings:
      logits = embed.attend(x)
    else:
      logits = nn.Dense(cfg.vocab_size, use_bias=False, dtype=dtype, param_dtype=param_dtype,
                        kernel_init=normal_init(cfg.init_std, ("embed", "vocab")), name="lm_head")(x)
    return nn.with_logical_constraint(logits.astype(jnp.float32),
                                      ("activation_batch", "activation_length", "activation_vocab"))

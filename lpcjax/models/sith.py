"""The ``sith`` family: a GPT-2 transformer fed L log-compressed slots + the m recent tokens.

Input: a window of H + m tokens, H = the history length (M = round(tau*_max) for the
compressed model, L for the delta-pulse control). The H older tokens are embedded and
compressed once, before the first block, into L slots (``lpcjax.layers.sith``); the transformer
runs unchanged on [L slots; m tokens] with learned positions for all L + m inputs. Attention
mask: a token sees every slot and the tokens up to itself; a slot sees only slots (a slot that
saw a token would leak that token into the slots every earlier token reads). The model predicts
the m recent tokens only: logits [batch, m, vocab], and ``lm_loss`` scores exactly those m
positions. Windows are taken with stride m, so every token is predicted once, with up to H
tokens of (compressed) history.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from lpcjax.decoding import prefill_by_steps
from lpcjax.layers.common import TokenEmbed, dtype_of, normal_init
from lpcjax.layers.sith import SITHCompressor

from .decoder import rematted, scanned_layers
from .table import register
from .language_model import language_model_evaluator, language_model_family
from .sith_config import SITHConfig


def slot_token_mask(num_slots, num_tokens):
  """[L + m, L + m] bool: slots see slots; tokens see slots and tokens up to themselves."""
  size = num_slots + num_tokens
  row, col = jnp.arange(size)[:, None], jnp.arange(size)[None, :]
  slot_col = col < num_slots
  return jnp.where(row < num_slots, slot_col, slot_col | (col <= row))


class GPT2Block(nn.Module):
  """x [batch, S, d_model] -> (x, None): pre-LayerNorm attention under ``mask`` [S, S], GELU MLP.

  With ``cache`` (the layer's {"k", "v"} [batch, L + m, heads, head_dim], see ``init_cache``):
  x's keys and values are written into it at row ``index`` [batch] onwards and x attends over
  the whole cache under ``mask`` [batch, S, L + m]; returns (x, the written cache)."""

  config: SITHConfig

  @nn.compact
  def __call__(self, x, mask, cache=None, index=None):
    cfg = self.config
    dtype, param_dtype = dtype_of(cfg.dtype), dtype_of(cfg.param_dtype)
    dense = lambda features, axes, name: nn.Dense(features, dtype=dtype, param_dtype=param_dtype,
                                                  kernel_init=normal_init(cfg.init_std, axes), name=name)
    heads, head_dim = cfg.num_heads, cfg.resolved_head_dim
    h = nn.LayerNorm(dtype=dtype, param_dtype=param_dtype, name="ln_1")(x)
    qkv = dense(3 * heads * head_dim, ("embed", "mlp"), "c_attn")(h).reshape(x.shape[:2] + (3, heads, head_dim))
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    if cache is None:
      mask = mask[None, None]
    else:
      write = jax.vmap(lambda row, new, i: jax.lax.dynamic_update_slice_in_dim(row, new.astype(row.dtype), i, axis=0))
      cache = {"k": write(cache["k"], k, index), "v": write(cache["v"], v, index)}
      k, v, mask = cache["k"], cache["v"], mask[:, None]
    attended = jax.nn.dot_product_attention(q, k, v, mask=mask)
    x = x + dense(cfg.d_model, ("mlp", "embed"), "c_proj")(attended.reshape(x.shape[:2] + (heads * head_dim,)))
    h = nn.LayerNorm(dtype=dtype, param_dtype=param_dtype, name="ln_2")(x)
    h = jax.nn.gelu(dense(cfg.mlp_dim, ("embed", "mlp"), "c_fc")(h), approximate=True)
    return x + dense(cfg.d_model, ("mlp", "embed"), "mlp_proj")(h), cache


def history_fill(config):
  """The token the history holds before a sequence starts: <|endoftext|> (token 0 for
  vocabularies smaller than GPT-2's), as at the start of a document."""
  return 50256 if config.vocab_size > 50256 else 0


class SITHLM(nn.Module):
  """tokens [batch, T >= H + m] -> logits [batch, m, vocab] (float32) for the last m tokens.

  A longer input (a generated task's sequence, whose answers end it) is cut to its last H + m
  tokens: the model reads no further back than its slots reach, which is what the delta-pulse
  control is about (its L slots reach L tokens back, the compressed ones τ*_max).

  With ``cache`` (``init_cache``): tokens [batch, 1], one token per row at its row's position;
  returns (logits [batch, 1, vocab], the advanced cache), equal to ``windowed_logits`` at that
  position (module docstring of the decoding below, ``init_cache``).
  """

  config: SITHConfig

  def setup(self):
    cfg = self.config
    dtype, param_dtype = dtype_of(cfg.dtype), dtype_of(cfg.param_dtype)
    self.wte = TokenEmbed(cfg.vocab_size, cfg.d_model, dtype=dtype, param_dtype=param_dtype,
                          embedding_init=normal_init(cfg.init_std, ("vocab", "embed")))
    self.compressor = SITHCompressor(cfg.num_filters, cfg.k, cfg.c, cfg.tau_min, cfg.delta_pulse, dtype=dtype)
    self.wpe = self.param("wpe", normal_init(0.01, ("length", "embed")), (cfg.num_filters + cfg.chunk_len, cfg.d_model),
                          param_dtype)
    block = rematted(GPT2Block, cfg)
    if cfg.scan_layers:
      self.layers = scanned_layers(block, cfg, (nn.broadcast, 0, nn.broadcast), name=None)
    else:
      self.h = [block(cfg) for _ in range(cfg.num_layers)]
    self.ln_f = nn.LayerNorm(dtype=dtype, param_dtype=param_dtype)

  def __call__(self, tokens, segment_ids=None, cache=None):
    del segment_ids  # windows are contiguous text; documents are not separated here
    if cache is not None:
      return self.decode(tokens, cache)
    cfg = self.config
    if tokens.shape[1] < cfg.window_len:
      raise ValueError(f"sith: expected windows of H + m = {cfg.history_len} + {cfg.chunk_len} tokens, "
                       f"got {tokens.shape[1]}")
    tokens = tokens[:, -cfg.window_len:]
    slots = self.slots(tokens[:, :cfg.history_len])
    chunk = self.wte(tokens[:, cfg.history_len:]) + self.wpe[cfg.num_filters:].astype(slots.dtype)
    x, _ = self.blocks(jnp.concatenate([slots, chunk], axis=1), slot_token_mask(cfg.num_filters, cfg.chunk_len))
    return self.head(x[:, cfg.num_filters:])

  def slots(self, history):
    """history tokens [batch, H] -> the L slots [batch, L, d_model] with their positions."""
    embedded = self.wte(history)
    slots = self.compressor(embedded).astype(embedded.dtype)
    return slots + self.wpe[:self.config.num_filters].astype(slots.dtype)

  def blocks(self, x, mask, caches=None, index=None):
    """The stack of GPT2Blocks; ``caches`` stacked over layers (leading axis) or None."""
    if self.config.scan_layers:
      return self.layers(x, mask, caches, index)
    new = []
    for i, block in enumerate(self.h):
      x, cache = block(x, mask, None if caches is None else jax.tree.map(lambda a, i=i: a[i], caches), index)
      new.append(cache)
    return x, None if caches is None else jax.tree.map(lambda *a: jnp.stack(a), *new)

  def head(self, x):
    return self.wte.attend(self.ln_f(x)).astype(jnp.float32)  # GPT-2 ties the output layer to wte

  # Decoding. The logits at position t of a sequence are those of ``windowed_logits`` (the
  # way the model is trained and evaluated): t's chunk starts at c = m·floor(t/m), its slots
  # compress the H tokens before c (the fill token before the sequence), and t attends over the
  # L slots and the chunk's tokens c..t. The slots are fixed for a whole chunk and see only
  # slots, so each chunk's slot keys and values are computed once, when its first token comes.
  # Why recompress per chunk rather than update the slots per token: Φ(t', τ*) ∝ t'^k e^(−k t'/τ*)
  # is an order-(k + 1) recurrence per slot whose coefficients (Eulerian numbers, summing to k!,
  # ~1e158 at k = 100) no float format carries, and it is cut at t' = M besides; the slots are
  # only read at chunk starts, where one matmul over the last H tokens gives them exactly.

  def decode(self, tokens, cache):
    cfg = self.config
    if tokens.shape[1] != 1:
      raise ValueError(f"sith: a decoding cache takes one token per row, got {tokens.shape[1]} "
                       "(lpcjax.decoding.prefill_by_steps feeds a prompt)")
    offset = cache["position"] % cfg.chunk_len  # the token's place in its chunk
    opening = offset == 0
    # only at a chunk's first token (rows of a batch reach it at different steps)
    cache = nn.cond(jnp.any(opening), SITHLM.open_chunk, lambda module, cache, opening: cache, self, cache, opening)
    row = cfg.num_filters + offset  # the token's row among the L + m inputs
    embedded = self.wte(tokens)
    x = embedded + jnp.take(self.wpe, row, axis=0)[:, None].astype(embedded.dtype)
    visible = jnp.arange(cfg.num_filters + cfg.chunk_len)[None, None, :] <= row[:, None, None]
    x, layers = self.blocks(x, visible, cache["layers"], row)
    recent = jnp.concatenate([cache["recent"][:, 1:], tokens.astype(jnp.int32)], axis=1)
    return self.head(x), {"position": cache["position"] + 1, "recent": recent, "layers": layers}

  def open_chunk(self, cache, opening):
    """Write the slots' keys and values of the chunk that starts now into the rows ``opening``."""
    cfg = self.config
    batch = opening.shape[0]
    slots = self.slots(cache["recent"])
    slot_columns = jnp.arange(cfg.num_filters + cfg.chunk_len) < cfg.num_filters  # slots see only slots
    mask = jnp.broadcast_to(slot_columns, (batch, cfg.num_filters, slot_columns.shape[0]))
    _, layers = self.blocks(slots, mask, cache["layers"], jnp.zeros((batch,), jnp.int32))
    keep = opening[None, :, None, None, None]  # layers, batch, rows, heads, head_dim
    layers = jax.tree.map(lambda new, old: jnp.where(keep, new, old), layers, cache["layers"])
    return {**cache, "layers": layers}


def init_cache(config, batch, max_len=None):
  """The empty decoding cache of a SITH model for ``batch`` rows: each row's position, its last
  H tokens (the fill token before the sequence) and per layer the keys and values of the L
  slots and of the current chunk's tokens, [layers, batch, L + m, heads, head_dim]. Its size is
  fixed by the model (H + m), so ``max_len`` is not needed."""
  del max_len
  rows, dtype = config.num_filters + config.chunk_len, dtype_of(config.dtype)
  kv = jnp.zeros((config.num_layers, batch, rows, config.num_heads, config.resolved_head_dim), dtype)
  return {"position": jnp.zeros((batch,), jnp.int32),
          "recent": jnp.full((batch, config.history_len), history_fill(config), jnp.int32),
          "layers": {"k": kv, "v": kv}}


def windowed_logits(model, params, inputs, segment_ids=None):
  """Logits [batch, T, vocab] at every position of a long sequence ``inputs`` [batch, T]: the
  model is run the way it is trained, over windows with stride m, so each position is predicted
  once with up to H tokens of history. Before the sequence starts the history holds
  <|endoftext|> (``history_fill``), as at the start of a document."""
  del segment_ids  # windows are contiguous text
  cfg = model.config
  history, chunk = cfg.history_len, cfg.chunk_len
  batch, seq_len = inputs.shape
  if seq_len % chunk:
    raise ValueError(f"eval_len {seq_len} must be a multiple of the model's chunk length m = {chunk}")
  padded = jnp.concatenate([jnp.full((batch, history), history_fill(cfg), inputs.dtype), inputs], axis=1)
  starts = jnp.arange(seq_len // chunk) * chunk

  def one_window(start):  # window [start - H, start + m) of the sequence -> logits at [start, start + m)
    return model.apply({"params": params}, jax.lax.dynamic_slice_in_dim(padded, start, history + chunk, axis=1))

  logits = jax.lax.map(one_window, starts)  # [chunks, batch, m, vocab], one window at a time
  return jnp.moveaxis(logits, 0, 1).reshape(batch, seq_len, -1)


# lm_loss scores the last m targets of each window, the positions the model predicts.
# Throughput counts the m predicted tokens of each window, not the H history tokens read with them.
def upgrade_saved_sith(values):
  """A config.json saved before SITH's blocks were scanned has no ``scan_layers``: its params
  are h_0, h_1, ..., which only the unscanned stack reads."""
  return {**values, "model": {"scan_layers": False, **values["model"]}}


register(language_model_family("sith", SITHConfig, SITHLM,
                               evaluator=language_model_evaluator(windowed_logits),
                               init_cache=init_cache, prefill=prefill_by_steps,
                               units_per_example=lambda config: config.model.chunk_len,
                               upgrade_saved=upgrade_saved_sith))

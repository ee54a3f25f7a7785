"""The dual-timescale memory of LPC-SM (the LPC-SM spec §3): chunk summaries written into a fast
and a slow state (the slow one through ONT), read causally by every token of the next chunk.

The paper's equations were lost (the LPC-SM spec marks them NOT FOUND); every such choice is a
config field below, with the default chosen and the reason beside it.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from .common import Projection, constant_init, logit
from .configs import MemoryConfig  # noqa: F401  (re-exported: the layer's config)
from .ont import ONT, ONTConfig, ont_write


def linear_recurrence(decay, inputs, initial):
  """s_k = decay_k ⊙ s_{k−1} + inputs_k along axis 1, s_{−1} = initial, by associative scan.

  decay, inputs [batch, K, m]; initial [batch, m] -> all states [batch, K, m]. The pairs
  (a, b) compose as (a1, b1) then (a2, b2) = (a1 a2, a2 b1 + b2): O(log K) depth, no loop.
  """
  inputs = inputs.at[:, 0].add(decay[:, 0] * initial)

  def combine(first, second):
    return first[0] * second[0], second[0] * first[1] + second[1]

  return jax.lax.associative_scan(combine, (decay, inputs), axis=1)[1]


class DualTimescaleMemory(nn.Module):
  """x [batch, seq, d], state (None: zeros) -> (reads [batch, seq, d], new state).

  Chunk k (of K = seq / chunk_size) has summary c_k = W_c pool(x over chunk k) ∈ R^m, pool the
  mean or (``summary_pool="attention"``) Σ_t softmax_t(q·x_t) x_t. Then
      fast  f_k = a_k ⊙ f_{k−1} + (1 − a_k) ⊙ c_k              (linear: one associative scan)
      slow  s_k = λ_k ⊙ s_{k−1} + (1 − λ_k) ⊙ ONT(c_k; s_{k−1})  (the write reads s_{k−1}: lax.scan)
  with a_k = σ(θ_a + U_a c_k), λ_k = σ(θ_λ + U_λ c_k) (``selective_decay``; U = 0 at init, and
  without it a, λ = σ(θ) for every chunk). Both are exponential moving averages, so the states
  stay on the scale of a summary. At init (q = 0, U = 0) the layer is the mean-pooled one with
  fixed decays; q and U get gradients from the first step on, through W_c and the reads. The slow
  recurrence is non-linear in s, so it runs as a lax.scan over chunks (K steps of O(m) work,
  cheap next to the token path); only chunk boundaries write, never single tokens.

  Every token of chunk k reads the states after chunk k − 1 (chunk 0: the carried-in state):
      read = W_f f_{k−1} + W_s s_{k−1}  ->  [d]
  so nothing from its own chunk or later leaks in. The new state {"fast", "slow"} [batch, m] is
  the state after the last chunk: calling the layer chunk by chunk with the carried state gives
  the same reads as one pass over the whole sequence.

  One token at a time (``token``: {"chunk_inputs" [batch, chunk_size, d] float32, the inputs of
  the current chunk so far, "position" [batch] the token's stream position}; x [batch, 1, d]):
  the token is written into ``chunk_inputs`` at position % chunk_size and reads the carried
  state; a row whose token completes its chunk writes that chunk's summary, the same K = 1 pass
  of the equations above over the buffered chunk. Returns (reads, (new state, new chunk_inputs)).
  """

  config: MemoryConfig

  @nn.compact
  def __call__(self, x, state=None, token=None):
    cfg = self.config
    batch, seq, d = x.shape
    m = cfg.memory_dim
    if state is None:
      state = self.initial_state(batch)
    if token is None:
      if seq % cfg.chunk_size:
        raise ValueError(f"seq {seq} must be a multiple of chunk_size {cfg.chunk_size}")
      chunk_inputs = x.astype(jnp.float32).reshape(batch, seq // cfg.chunk_size, cfg.chunk_size, d)
    else:  # one token: buffer it; its row's chunk is complete when it is the chunk's last token
      offset = token["position"] % cfg.chunk_size
      here = jnp.arange(cfg.chunk_size)[None, :, None] == offset[:, None, None]
      buffered = jnp.where(here, x.astype(jnp.float32), token["chunk_inputs"])
      chunk_inputs = buffered[:, None]  # [batch, K = 1, chunk_size, d]
    summary_std = d ** -0.5 if cfg.init_std is None else cfg.init_std
    summaries = Projection((m,), ("embed", None), init_std=summary_std, name="summary")(self.pool(chunk_inputs))

    def decay(name, value):
      """[batch, K, m]: σ(θ) per channel, shifted per chunk by U c_k under ``selective_decay``."""
      raw = self.param(name, constant_init(logit(value), (None,)), (m,))
      if cfg.selective_decay:
        raw = raw + Projection((m,), (None, None), init_std=0.0, name=name.replace("_logit", "_shift"))(summaries)
      return jnp.broadcast_to(jax.nn.sigmoid(raw), summaries.shape)

    fast_decay = decay("fast_decay_logit", cfg.fast_decay_init)
    fast = linear_recurrence(fast_decay, (1 - fast_decay) * summaries, state["fast"])
    fast_before = jnp.concatenate([state["fast"][:, None], fast[:, :-1]], axis=1)  # [batch, K, m]
    read = Projection((d,), (None, "embed"), init_std=cfg.read_init_std, name="read_fast")(fast_before)
    new_state = {"fast": fast[:, -1], "slow": state["slow"]}

    if cfg.slow:
      slow_decay = decay("slow_decay_logit", cfg.slow_decay_init)
      if cfg.ont:  # one learned gain for the layer
        kappa = ONT(ONTConfig(kappa_max=cfg.kappa_max, kappa_init=cfg.kappa_init, eps=cfg.ont_eps), name="ont").gain()

      def step(slow, chunk):
        summary, retain = chunk
        write = ont_write(summary, slow, kappa, cfg.ont_eps) if cfg.ont else summary
        slow = retain * slow + (1 - retain) * write
        return slow, slow

      final_slow, slow_all = jax.lax.scan(step, state["slow"],
                                          (jnp.swapaxes(summaries, 0, 1), jnp.swapaxes(slow_decay, 0, 1)))
      slow_all = jnp.swapaxes(slow_all, 0, 1)  # [batch, K, m]
      slow_before = jnp.concatenate([state["slow"][:, None], slow_all[:, :-1]], axis=1)
      read = read + Projection((d,), (None, "embed"), init_std=cfg.read_init_std, name="read_slow")(slow_before)
      new_state["slow"] = final_slow

    if token is not None:  # the read is the carried state's (K = 1); only a completed chunk writes
      complete = (offset == cfg.chunk_size - 1)[:, None]
      new_state = jax.tree.map(lambda new, old: jnp.where(complete, new, old), new_state, state)
      return read.astype(x.dtype), (new_state, buffered)
    reads = jnp.repeat(read, cfg.chunk_size, axis=1).astype(x.dtype)  # chunk k's read to its tokens
    return reads, new_state

  def pool(self, chunk_inputs):
    """[batch, K, chunk_size, d] -> [batch, K, d]: the mean, or softmax pooling with a learned
    query (no 1/√d: the query starts at zero, where the pooling is the mean, and grows from there)."""
    if self.config.summary_pool == "mean":
      return chunk_inputs.mean(axis=2)
    query = self.param("pool_query", constant_init(0.0, (None,)), (chunk_inputs.shape[-1],))
    weights = jax.nn.softmax(jnp.einsum("bkcd,d->bkc", chunk_inputs, query), axis=-1)
    return jnp.einsum("bkc,bkcd->bkd", weights, chunk_inputs)

  def initial_state(self, batch):
    return initial_memory_state(self.config, batch)


def initial_memory_state(config, batch):
  """The empty state of ``DualTimescaleMemory(config)``: both states zero."""
  zeros = jnp.zeros((batch, config.memory_dim), jnp.float32)
  return {"fast": zeros, "slow": zeros}


def initial_chunk_inputs(config, batch):
  """The empty buffer of the current chunk's inputs, for one-token calls (``token``)."""
  return jnp.zeros((batch, config.chunk_size, config.d_model), jnp.float32)

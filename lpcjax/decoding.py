"""Text generation for the language-model families: prefill, then cached one-token decoding.

    from lpcjax.decoding import Sampling, generate
    result = generate(family, model, params, [[15496, 995], [40]], max_new_tokens=32,
                      sampling=Sampling(temperature=0.8, top_p=0.95), seed=0, end_token=50256)

* Prefill runs the model's parallel pass (any attention backend) over the prompts, right-padded
  into one batch: each row keeps its own length, and with ``segment_ids`` a packed prompt row
  continues its last segment (no attention, decay, RoPE offset or KV-shift crosses a segment).
  The prompt batch is padded to a power-of-two length (at least 16), so prefill compiles once
  per such bucket.
* Decoding reads a fixed-size cache allocated once for ``max_len`` (FoX: keys, values and the
  running sum of log f per layer and head; Pro blocks: the previous token's projections; RoPE
  positions), and runs on the device in one ``lax.while_loop``, which compiles once per (model,
  batch, max_len, sampling) and stops when every row has emitted ``end_token``. Under a mesh
  (``jax.set_mesh`` + logical-axis rules) the cache is sharded like the activations (batch,
  heads).
* Sampling: greedy (temperature 0), temperature, top-k, top-p (nucleus: the smallest set of
  tokens whose probability reaches p; tokens tied with its last one are kept too), seeded:
  step t draws with fold_in(PRNGKey(seed), t).
* ``on_token(step, tokens)`` streams each step's tokens [batch] to the host as they are drawn
  (a debug callback: unordered, since ordered effects need one device; with several devices it
  may come once per device, so keep the steps and print each once, in order, as ``TokenPrinter``
  does).

Families without cached decoding (``Family.init_cache`` None, e.g. SITH, which reads fixed
windows of compressed history) raise a one-line ``GenerationError``.
"""

import dataclasses
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from lpcjax.errors import UserError


class GenerationError(UserError, ValueError):
  """A request that cannot be decoded: the family, the lengths or the prompts."""


@dataclasses.dataclass(frozen=True)
class Sampling:
  temperature: float = 1.0  # 0: greedy
  top_k: int = 0  # 0: all tokens
  top_p: float = 1.0  # 1: all tokens

  def __post_init__(self):
    if self.temperature < 0 or self.top_k < 0 or not 0 < self.top_p <= 1:
      raise GenerationError(f"sampling: need temperature >= 0, top_k >= 0, 0 < top_p <= 1; got {self}")


GREEDY = Sampling(temperature=0.0)


def sample(logits, key, sampling):
  """Tokens [batch] from float32 logits [batch, vocab]."""
  if sampling.temperature == 0:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  logits = logits / sampling.temperature
  if sampling.top_k:
    kth = jax.lax.top_k(logits, sampling.top_k)[0][:, -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  if sampling.top_p < 1:
    ordered = jnp.sort(logits, axis=-1)[:, ::-1]
    probs = jax.nn.softmax(ordered, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # mass of the tokens ranked above each one
    cutoff = jnp.min(jnp.where(before < sampling.top_p, ordered, jnp.inf), axis=-1, keepdims=True)
    logits = jnp.where(logits < cutoff, -jnp.inf, logits)
  return jax.random.categorical(key, logits).astype(jnp.int32)


def prompt_bucket(length, max_len):
  """The padded prompt length: the next power of two >= length (at least 16), at most max_len."""
  return min(max_len, max(16, 1 << (int(length) - 1).bit_length()))


@dataclasses.dataclass(frozen=True)
class GenerationResult:
  tokens: list  # per row, the generated token ids (up to and including end_token)
  prompt_lengths: list


def _prefill(model, init_cache, sampling, max_len, params, tokens, segment_ids, lengths, key):
  cache = init_cache(model.config, tokens.shape[0], max_len)
  cache = {**cache, "lengths": lengths}
  logits, cache = model.apply(params, tokens, segment_ids, cache)
  last = jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)[:, 0]
  return sample(last, jax.random.fold_in(key, 0), sampling), cache


def _decode(model, sampling, end_token, on_token, params, cache, first, key, steps):
  batch, max_len = cache["segments"].shape
  out = jnp.zeros((batch, max_len), jnp.int32).at[:, 0].set(first)
  done = jnp.zeros((batch,), bool) if end_token is None else first == end_token
  if on_token is not None:
    jax.debug.callback(on_token, 0, first)

  def keep_going(state):
    step, _, _, _, done = state
    return (step < steps) & ~done.all()

  def one_token(state):
    step, token, cache, out, done = state
    logits, cache = model.apply(params, token[:, None], None, cache)
    token = sample(logits[:, 0], jax.random.fold_in(key, step), sampling)
    if end_token is not None:
      token = jnp.where(done, end_token, token)
      done = done | (token == end_token)
    if on_token is not None:
      jax.debug.callback(on_token, step, token)
    return step + 1, token, cache, out.at[:, step].set(token), done

  step, _, _, out, done = jax.lax.while_loop(keep_going, one_token, (jnp.int32(1), first, cache, out, done))
  return out, step


_prefill_jit = jax.jit(_prefill, static_argnums=(0, 1, 2, 3))
_decode_jit = jax.jit(_decode, static_argnums=(0, 1, 2, 3))


class TokenPrinter:
  """An ``on_token`` that prints row 0's tokens in step order, each once."""

  def __init__(self, decode, out):
    self.decode, self.out, self.pending, self.next = decode, out, {}, 0

  def __call__(self, step, tokens):
    self.pending[int(step)] = int(tokens[0])
    while self.next in self.pending:
      self.out.write(self.decode([self.pending.pop(self.next)]))
      self.out.flush()
      self.next += 1


def check_decodes(family):
  """A one-line GenerationError for a family without cached decoding."""
  if family.init_cache is None:
    raise GenerationError(f"the {family.name} family cannot generate text token by token (it has no "
                          "decoding cache); evaluate it with eval.py")


def right_padded(rows, width, fill=0):
  batch = np.full((len(rows), width), fill, np.int32)
  for i, row in enumerate(rows):
    batch[i, :len(row)] = row
  return batch


def generate(family, model, params, prompts, *, max_new_tokens, max_len=None, sampling=GREEDY, seed=0,
             end_token=None, segment_ids=None, on_token: Optional[Callable] = None):
  """Continue each prompt (a list of token ids; ``segment_ids`` the same shape, optional) by up
  to ``max_new_tokens`` tokens. ``params`` is the variables dict model.apply takes
  ({"params": ...}); ``max_len`` (default: longest prompt + max_new_tokens) sizes the cache."""
  check_decodes(family)
  lengths = [len(p) for p in prompts]
  if not prompts or min(lengths) == 0:
    raise GenerationError("generate: every prompt needs at least one token")
  if max_new_tokens < 1:
    raise GenerationError(f"generate: max_new_tokens must be >= 1, got {max_new_tokens}")
  max_len = max_len or max(lengths) + max_new_tokens
  if max(lengths) + max_new_tokens > max_len:
    raise GenerationError(f"generate: the longest prompt ({max(lengths)} tokens) + max_new_tokens "
                          f"({max_new_tokens}) exceeds max_len={max_len}")
  width = prompt_bucket(max(lengths), max_len)
  tokens = jnp.asarray(right_padded(prompts, width))
  segments = None if segment_ids is None else jnp.asarray(right_padded(segment_ids, width))
  key = jax.random.PRNGKey(seed)
  first, cache = _prefill_jit(model, family.init_cache, sampling, max_len, params, tokens, segments,
                              jnp.asarray(lengths, jnp.int32), key)
  out, steps = _decode_jit(model, sampling, end_token, on_token, params, cache, first, key, jnp.int32(max_new_tokens))
  out, steps = np.asarray(out), int(steps)
  rows = []
  for row in out[:, :steps]:
    if end_token is not None and end_token in row:
      row = row[:list(row).index(end_token) + 1]
    rows.append(row.tolist())
  return GenerationResult(rows, lengths)

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

* Recurrent caches (LPC-SM, SITH: ``Family.prefill`` is ``prefill_by_steps``) hold a state of
  fixed size, not every position; a parallel pass cannot leave each row of a right-padded batch
  at its own length, so their prompts are fed through the same one-token step, a row keeping
  its cache once its prompt has ended.
* ``stop_when`` (off by default): a family's own way for a row to end besides the end token,
  from its ``Family.stop_rule`` (LPC-SM's stop head: ``--stop-head P``); a row for which it
  holds after a step ends there, its next token the end token.

Which families decode, and why the others cannot: docs/evaluation.md (Generate). A family that cannot
raises a one-line ``GenerationError`` with its reason (``Family.no_decoding_reason``).
"""

import dataclasses
from typing import Callable, Optional, Protocol

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


def select_rows(keep, new, old):
  """The cache ``new`` where keep [batch] is True, else ``old``. A cache's "layers" subtree is
  stacked over layers (batch on axis 1); every other leaf has batch first."""
  def pick(axis):
    def one(a, b):
      shape = [1] * a.ndim
      shape[axis] = keep.shape[0]
      return jnp.where(keep.reshape(shape), a, b)
    return one
  return {name: jax.tree.map(pick(1 if name == "layers" else 0), value, old[name]) for name, value in new.items()}


def prefill_by_steps(model, params, tokens, segment_ids, cache, lengths):
  """A ``Family.prefill`` for recurrent caches: the right-padded prompts tokens [batch, P] go
  through the one-token step in a ``lax.scan``; a row past its prompt length keeps its cache.
  Returns (the logits [batch, vocab] after each row's last prompt token, the cache)."""
  if segment_ids is not None:
    raise GenerationError("generate: this family's decoding does not take segment_ids")

  def one_token(carry, column):
    cache, last = carry
    position, token = column
    logits, stepped = model.apply(params, token[:, None], None, cache)
    active = position < lengths
    return (select_rows(active, stepped, cache), jnp.where(active[:, None], logits[:, 0], last)), None

  first, _ = jax.eval_shape(lambda c: model.apply(params, tokens[:, :1], None, c), cache)
  last = jnp.zeros((tokens.shape[0], first.shape[-1]), first.dtype)
  columns = (jnp.arange(tokens.shape[1]), jnp.swapaxes(tokens, 0, 1))
  (cache, last), _ = jax.lax.scan(one_token, (cache, last), columns)
  return last, cache


class StopRule(Protocol):
  """A family's own way for a generated row to end, beside the end token (``Family.stop_rule``)."""

  def add_arguments(self, parser):
    """Its flags of ``python -m lpcjax.generate`` (listed by ``--run RUN --help``)."""

  def resolve(self, model, options, end_token):
    """(stop_when, end_token) for ``generate``: ``stop_when(cache)`` -> bool [batch], the rows
    that end after their last token (None: the rule is off with these ``options``), and the
    end token such rows take (``end_token`` as given, or the family's default)."""


def _prefill(model, init_cache, prefill, sampling, max_len, stop_when, end_token, params, tokens, segment_ids,
             lengths, key):
  cache = init_cache(model.config, tokens.shape[0], max_len)
  if prefill is None:
    cache = {**cache, "lengths": lengths}
    logits, cache = model.apply(params, tokens, segment_ids, cache)
    last = jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)[:, 0]
  else:
    last, cache = prefill(model, params, tokens, segment_ids, cache, lengths)
  first = sample(last, jax.random.fold_in(key, 0), sampling)
  if stop_when is not None:
    first = jnp.where(stop_when(cache), end_token, first)
  return first, cache


def _decode(model, sampling, end_token, on_token, max_len, stop_when, params, cache, first, key, steps):
  batch = first.shape[0]
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
    if stop_when is not None:
      token = jnp.where(stop_when(cache), end_token, token)
    if end_token is not None:
      token = jnp.where(done, end_token, token)
      done = done | (token == end_token)
    if on_token is not None:
      jax.debug.callback(on_token, step, token)
    return step + 1, token, cache, out.at[:, step].set(token), done

  step, _, _, out, done = jax.lax.while_loop(keep_going, one_token, (jnp.int32(1), first, cache, out, done))
  return out, step


_prefill_jit = jax.jit(_prefill, static_argnums=(0, 1, 2, 3, 4, 5, 6))
_decode_jit = jax.jit(_decode, static_argnums=(0, 1, 2, 3, 4, 5))


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
  """A one-line GenerationError, with the family's reason, for a family without cached decoding."""
  if family.init_cache is None:
    raise GenerationError(f"the {family.name} family cannot decode token by token: {family.no_decoding_reason}")


def right_padded(rows, width, fill=0):
  batch = np.full((len(rows), width), fill, np.int32)
  for i, row in enumerate(rows):
    batch[i, :len(row)] = row
  return batch


def generate(family, model, params, prompts, *, max_new_tokens, max_len=None, sampling=GREEDY, seed=0,
             end_token=None, segment_ids=None, on_token: Optional[Callable] = None, stop_when=None):
  """Continue each prompt (a list of token ids; ``segment_ids`` the same shape, optional) by up
  to ``max_new_tokens`` tokens. ``params`` is the variables dict model.apply takes
  ({"params": ...}); ``max_len`` (default: longest prompt + max_new_tokens) sizes the cache.
  ``stop_when`` (None: off): a hashable function of the decoding cache -> bool [batch], a
  family's rule (``StopRule.resolve``) for the rows that end after their last token, with
  ``end_token`` as their last token."""
  check_decodes(family)
  if stop_when is not None and end_token is None:
    raise GenerationError("generate: stop_when needs the end_token that rows which stop take")
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
  first, cache = _prefill_jit(model, family.init_cache, family.prefill, sampling, max_len, stop_when, end_token,
                              params, tokens, segments, jnp.asarray(lengths, jnp.int32), key)
  out, steps = _decode_jit(model, sampling, end_token, on_token, max_len, stop_when, params, cache, first, key,
                           jnp.int32(max_new_tokens))
  out, steps = np.asarray(out), int(steps)
  rows = []
  for row in out[:, :steps]:
    if end_token is not None and end_token in row:
      row = row[:list(row).index(end_token) + 1]
    rows.append(row.tolist())
  return GenerationResult(rows, lengths)

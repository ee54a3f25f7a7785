"""The generated tasks of the mechanism suite (docs/mechanisms.md), besides MQAR (``mqar.py``).

Each is scored only at its answers and has one difficulty knob; the examples and the reason each
task exists:

* ``overwrite``: keys are written again and again (``k v`` pairs, a key's value reassigned each
  time), then every key is queried; the answer is its latest value. What a forget gate is for:
  without a notion of "latest", attention sees every value the key ever had. Knob:
  ``overwrite_num_keys`` (fewer keys, more writes each); buckets: writes to the queried key.
* ``delayed_id``: k identifiers, a distractor span, a trigger, the identifiers again: the trained
  version of LPC-SM's delayed-identifier probe (its Table 4). With a distractor longer than a local
  attention window only a memory can carry the identifiers. Knobs: ``delayed_id_max_ids`` (k is
  drawn from [min, max] per example; buckets: k, so one run measures the memory's capacity) and
  ``delayed_id_gap`` (the distractor's length; 0: all the sequence leaves). The recall is always
  at the end of the sequence (so models that predict only a window's last tokens, SITH, are
  scored on it too).
* ``noisy_recall``, ``fuzzy_recall``, ``selective_copy``: MAD's tasks (Poli et al. 2024), as we
  read their definitions. Noisy recall: a stream of ``k v`` pairs from a per-example dictionary
  with noise tokens between the pairs (knob: ``noisy_noise_fraction``). Fuzzy recall: keys and
  values are several tokens long (knobs: ``fuzzy_key_len``, ``fuzzy_value_len``). Both are scored
  at the value tokens of every key seen before in the example; buckets: distance to the key's
  previous occurrence. Selective copying: ``copy_num_tokens`` content tokens scattered among
  blanks, a separator, then the content tokens in order (buckets: position in the copy).

Token ranges are disjoint by role (noise, keys, values, ...), so a role never hides as another.
"""

import dataclasses
from typing import ClassVar

import numpy as np

from lpcjax.config import require

from .generated import GeneratedConfig, answers_at, distance_bucket, register_generated, require_vocab


@dataclasses.dataclass(frozen=True)
class TaskConfig(GeneratedConfig):
  task_vocab_size: int = 256

  def __post_init__(self):
    super().__post_init__()
    require(self.task_vocab_size >= 8, "data.task_vocab_size", f"must be >= 8, got {self.task_vocab_size}")


def _keys_and_values(rng, vocab, count):
  """``count`` distinct keys from [1, V/2) and values from [V/2, V)."""
  half = vocab // 2
  return rng.choice(np.arange(1, half), size=count, replace=False), rng.integers(half, vocab, size=count)


# ------------------------------------------------------------------------------------ overwrite


@dataclasses.dataclass(frozen=True)
class OverwriteConfig(TaskConfig):
  """Writes ``k v`` (keys [1, V/2), values [V/2, V)) fill the sequence but its end, where every
  key is queried once (``k v``, the value scored) with its latest value."""

  kind: ClassVar[str] = "overwrite"
  answer_bucket_name: ClassVar[str] = "writes to the key"

  overwrite_num_keys: int = 8

  def __post_init__(self):
    super().__post_init__()
    keys = self.overwrite_num_keys
    require(keys >= 1, "data.overwrite_num_keys", "must be >= 1")
    require(self.seq_len + 1 >= 4 * keys, "data.overwrite_num_keys",
            f"{keys} keys need seq_len >= {4 * keys - 1} (one write and one query each)")
    require_vocab(self, 2 * keys + 2, f"{keys} distinct keys")

  @property
  def chance(self):
    return 1.0 / (self.task_vocab_size - self.task_vocab_size // 2)


def overwrite_example(rng, cfg):
  size, num_keys = cfg.seq_len + 1, cfg.overwrite_num_keys
  keys, _ = _keys_and_values(rng, cfg.task_vocab_size, num_keys)
  half = cfg.task_vocab_size // 2
  num_writes = (size - 2 * num_keys) // 2
  written = np.concatenate([np.arange(num_keys), rng.integers(0, num_keys, num_writes - num_keys)])
  written = rng.permutation(written)
  values = rng.integers(half, cfg.task_vocab_size, size=num_writes)
  tokens = np.zeros(size, np.int32)
  start = size - 2 * num_keys - 2 * num_writes  # 0 or 1: a leading filler token when size is odd
  tokens[start:start + 2 * num_writes:2] = keys[written]
  tokens[start + 1:start + 2 * num_writes:2] = values
  latest = {int(k): int(v) for k, v in zip(written, values)}  # later writes replace earlier ones
  counts = np.bincount(written, minlength=num_keys)
  order = rng.permutation(num_keys)
  query = size - 2 * num_keys + 2 * np.arange(num_keys)
  tokens[query] = keys[order]
  tokens[query + 1] = [latest[int(k)] for k in order]
  return (tokens, *answers_at(cfg.seq_len, query, [distance_bucket(counts[k]) for k in order]))


# ----------------------------------------------------------------------------------- delayed_id


@dataclasses.dataclass(frozen=True)
class DelayedIdConfig(TaskConfig):
  """Distractor tokens [2, V/2), identifiers [V/2, V) (distinct in an example), trigger 1:
  ``... distractor, id_1 .. id_k, distractor (gap), trigger, id_1 .. id_k`` ending the sequence
  (with ``delayed_id_repeat`` r: ``id_1 x r .. id_k x r`` first)."""

  kind: ClassVar[str] = "delayed_id"
  answer_bucket_name: ClassVar[str] = "identifiers"

  delayed_id_min_ids: int = 1
  delayed_id_max_ids: int = 8
  delayed_id_gap: int = 0  # 0: the identifiers start the sequence (the longest gap it allows)
  # Each identifier written this many times in a row where it first appears (recalled once): a
  # memory that keeps only a blurred past (SITH's slots average ~15 tokens at this range) can
  # carry an identifier that fills a share of its span, not a lone one.
  delayed_id_repeat: int = 1

  def __post_init__(self):
    super().__post_init__()
    low, high = self.delayed_id_min_ids, self.delayed_id_max_ids
    gap, repeat = self.delayed_id_gap, self.delayed_id_repeat
    require(1 <= low <= high, "data.delayed_id_min_ids", f"must be in [1, delayed_id_max_ids={high}], got {low}")
    require(gap >= 0, "data.delayed_id_gap", f"must be >= 0, got {gap}")
    require(repeat >= 1, "data.delayed_id_repeat", f"must be >= 1, got {repeat}")
    need = (repeat + 1) * high + max(gap, 1)
    require(need + 1 <= self.seq_len + 1, "data.delayed_id_gap",
            f"{high} identifiers ({repeat} times each, then once), a trigger and a gap of {max(gap, 1)} "
            f"need seq_len >= {need}")
    require_vocab(self, 2 * high + 4, f"{high} distinct identifiers")

  @property
  def chance(self):
    return 1.0 / (self.task_vocab_size - self.task_vocab_size // 2)


def delayed_id_example(rng, cfg):
  size, half = cfg.seq_len + 1, cfg.task_vocab_size // 2
  count = int(rng.integers(cfg.delayed_id_min_ids, cfg.delayed_id_max_ids + 1))
  ids = rng.choice(np.arange(half, cfg.task_vocab_size), size=count, replace=False)
  tokens = rng.integers(2, half, size=size).astype(np.int32)  # the distractor everywhere else
  recall, written = size - count, count * cfg.delayed_id_repeat
  gap = cfg.delayed_id_gap or recall - 1 - written
  first = recall - 1 - gap - written
  tokens[first:first + written] = np.repeat(ids, cfg.delayed_id_repeat)
  tokens[recall - 1] = 1
  tokens[recall:] = ids
  answers = np.arange(recall - 1, size - 1)  # the trigger and id_1 .. id_{k-1} predict the next id
  return (tokens, *answers_at(cfg.seq_len, answers, count))


# --------------------------------------------------------------------------------- noisy_recall


def _stream_of_pairs(rng, size, items, noise=()):
  """Lay ``items`` (arrays of tokens, each kept whole) and single ``noise`` tokens in a random
  order, left-padded with 0 to ``size``; returns the tokens and each item's start (-1: noise)."""
  pieces = [np.asarray(item, np.int32) for item in items] + [np.asarray([n], np.int32) for n in noise]
  kinds = np.concatenate([np.arange(len(items)), np.full(len(noise), -1)])
  order = rng.permutation(len(pieces))
  tokens = np.zeros(size, np.int32)
  starts = np.full(len(items), -1)
  position = size - sum(len(p) for p in pieces)
  for i in order:
    tokens[position:position + len(pieces[i])] = pieces[i]
    if kinds[i] >= 0:
      starts[kinds[i]] = position
    position += len(pieces[i])
  return tokens, starts


def _repeated_entry_answers(entry_of_item, starts, key_len, value_len):
  """Positions predicting the value tokens of every entry seen before, and the distance to its
  previous occurrence (bucketed)."""
  positions, buckets, last = [], [], {}
  for item in np.argsort(starts):
    entry, start = int(entry_of_item[item]), int(starts[item])
    if entry in last:
      first_value = start + key_len
      positions += range(first_value - 1, first_value + value_len - 1)
      buckets += [distance_bucket(start - last[entry])] * value_len
    last[entry] = start
  return positions, buckets


@dataclasses.dataclass(frozen=True)
class NoisyRecallConfig(TaskConfig):
  """Noise [1, V/4), keys [V/4, V/2), values [V/2, V); ``noisy_num_keys`` key-value pairs per
  example, repeated through the sequence with noise tokens between them."""

  kind: ClassVar[str] = "noisy_recall"

  noisy_num_keys: int = 8
  noisy_noise_fraction: float = 0.2

  def __post_init__(self):
    super().__post_init__()
    require(0.0 <= self.noisy_noise_fraction < 1.0, "data.noisy_noise_fraction", "must be in [0, 1)")
    require(self.noisy_num_keys >= 1, "data.noisy_num_keys", "must be >= 1")
    require_vocab(self, 4 * self.noisy_num_keys + 4, f"{self.noisy_num_keys} distinct keys")
    require(self.seq_len >= 4, "data.seq_len", "noisy recall needs seq_len >= 4")

  @property
  def chance(self):
    return 1.0 / (self.task_vocab_size - self.task_vocab_size // 2)


def noisy_recall_example(rng, cfg):
  size, vocab, quarter = cfg.seq_len + 1, cfg.task_vocab_size, cfg.task_vocab_size // 4
  keys = rng.choice(np.arange(quarter, 2 * quarter), size=cfg.noisy_num_keys, replace=False)
  values = rng.integers(vocab // 2, vocab, size=cfg.noisy_num_keys)
  num_noise = int(round(cfg.noisy_noise_fraction * size))
  num_pairs = (size - num_noise) // 2
  entries = rng.integers(0, cfg.noisy_num_keys, size=num_pairs)
  noise = rng.integers(1, quarter, size=size - 2 * num_pairs)
  tokens, starts = _stream_of_pairs(rng, size, [(keys[e], values[e]) for e in entries], noise)
  positions, buckets = _repeated_entry_answers(entries, starts, 1, 1)
  return (tokens, *answers_at(cfg.seq_len, positions, buckets))


# --------------------------------------------------------------------------------- fuzzy_recall


@dataclasses.dataclass(frozen=True)
class FuzzyRecallConfig(TaskConfig):
  """Keys of ``fuzzy_key_len`` tokens from [1, V/2), values of ``fuzzy_value_len`` tokens from
  [V/2, V); ``fuzzy_num_keys`` entries per example, repeated through the sequence."""

  kind: ClassVar[str] = "fuzzy_recall"

  fuzzy_num_keys: int = 8
  fuzzy_key_len: int = 2
  fuzzy_value_len: int = 2

  def __post_init__(self):
    super().__post_init__()
    require(self.fuzzy_num_keys >= 1, "data.fuzzy_num_keys", "must be >= 1")
    require(self.fuzzy_key_len >= 1, "data.fuzzy_key_len", "must be >= 1")
    require(self.fuzzy_value_len >= 1, "data.fuzzy_value_len", "must be >= 1")
    entry = self.fuzzy_key_len + self.fuzzy_value_len
    require(self.seq_len + 1 >= 2 * entry, "data.seq_len", f"fuzzy recall needs seq_len >= {2 * entry - 1}")

  @property
  def chance(self):
    return 1.0 / (self.task_vocab_size - self.task_vocab_size // 2)


def fuzzy_recall_example(rng, cfg):
  size, vocab, half = cfg.seq_len + 1, cfg.task_vocab_size, cfg.task_vocab_size // 2
  key_len, value_len, num_keys = cfg.fuzzy_key_len, cfg.fuzzy_value_len, cfg.fuzzy_num_keys
  keys = rng.integers(1, half, size=(num_keys, key_len))
  values = rng.integers(half, vocab, size=(num_keys, value_len))
  entries = rng.integers(0, num_keys, size=size // (key_len + value_len))
  tokens, starts = _stream_of_pairs(rng, size, [np.concatenate([keys[e], values[e]]) for e in entries])
  positions, buckets = _repeated_entry_answers(entries, starts, key_len, value_len)
  return (tokens, *answers_at(cfg.seq_len, positions, buckets))


# ------------------------------------------------------------------------------- selective_copy


@dataclasses.dataclass(frozen=True)
class SelectiveCopyConfig(TaskConfig):
  """Blank 0, separator 1, content [2, V): the content tokens among blanks, the separator, then
  the content in order, ending the sequence."""

  kind: ClassVar[str] = "selective_copy"
  answer_bucket_name: ClassVar[str] = "position in the copy"

  copy_num_tokens: int = 16

  def __post_init__(self):
    super().__post_init__()
    require(self.copy_num_tokens >= 1, "data.copy_num_tokens", "must be >= 1")
    require(self.seq_len >= 2 * self.copy_num_tokens + 1, "data.copy_num_tokens",
            f"{self.copy_num_tokens} tokens to copy need seq_len >= {2 * self.copy_num_tokens + 1}")

  @property
  def chance(self):
    return 1.0 / (self.task_vocab_size - 2)


def selective_copy_example(rng, cfg):
  size, count = cfg.seq_len + 1, cfg.copy_num_tokens
  content = rng.integers(2, cfg.task_vocab_size, size=count)
  context = size - count - 1
  tokens = np.zeros(size, np.int32)
  tokens[np.sort(rng.choice(context, size=count, replace=False))] = content
  tokens[context] = 1
  tokens[context + 1:] = content
  answers = np.arange(context, size - 1)
  return (tokens, *answers_at(cfg.seq_len, answers, [distance_bucket(i + 1) for i in range(count)]))


for _config, _example in ((OverwriteConfig, overwrite_example), (DelayedIdConfig, delayed_id_example),
                          (NoisyRecallConfig, noisy_recall_example), (FuzzyRecallConfig, fuzzy_recall_example),
                          (SelectiveCopyConfig, selective_copy_example)):
  register_generated(_config, _example)

TASK_KINDS = ("mqar", "overwrite", "delayed_id", "noisy_recall", "fuzzy_recall", "selective_copy")

"""Multi-query associative recall (MQAR, Zoology): the built-in long-context task.

Each example starts with ``num_pairs`` key-value pairs ``k1 v1 k2 v2 ...`` (keys unique, drawn
from [1, V/2); values from [V/2, V)). The rest of the sequence is filler token 0, except that
every key appears once more later as a query, followed by its value. The model is scored only
where the next token is a queried value, so it must recall a pair seen up to seq_len tokens
earlier. Query gaps are power-law: slot s after the pairs has weight (s + 1)^(power - 1).

Our choices where Zoology leaves room: filler is token 0 by default (``mqar_filler="zero"``, the
only signal is the pairs) or, with ``mqar_filler="random"``, random tokens (Zoology's
``random_non_queries``; never one of the example's keys, so no filler reads as a query); every key
is queried exactly once. The answers' buckets are their key-query distances (powers of two).
"""

import dataclasses
from typing import ClassVar

import numpy as np

from lpcjax.config import require, require_choice

from .generated import GeneratedConfig, GeneratedSource, answers_at, distance_bucket, register_generated


def mqar_example(rng, seq_len, vocab_size, num_pairs, gap_power, filler="zero"):
  """One example: tokens [seq_len + 1] (inputs = tokens[:-1], targets = tokens[1:]) and the
  loss mask [seq_len] (1 where the target is a queried value)."""
  half = vocab_size // 2
  keys = rng.choice(np.arange(1, half), size=num_pairs, replace=False)
  values = rng.integers(half, vocab_size, size=num_pairs)
  tokens = np.zeros(seq_len + 1, dtype=np.int32)
  pair_len = 2 * num_pairs
  tokens[0:pair_len:2] = keys
  tokens[1:pair_len:2] = values
  num_slots = (seq_len + 1 - pair_len) // 2
  weights = (np.arange(num_slots) + 1.0) ** (gap_power - 1.0)
  slots = rng.choice(num_slots, size=num_pairs, replace=False, p=weights / weights.sum())
  order = rng.permutation(num_pairs)
  query_pos = pair_len + 2 * slots
  tokens[query_pos] = keys[order]
  tokens[query_pos + 1] = values[order]
  loss_mask = np.zeros(seq_len, dtype=np.float32)
  loss_mask[query_pos] = 1.0
  if filler == "random":  # drawn last, so that the zero-filler examples stay as they were
    free = np.ones(seq_len + 1, bool)
    free[:pair_len] = False
    free[query_pos] = free[query_pos + 1] = False
    candidates = np.setdiff1d(np.arange(1, vocab_size), keys)
    tokens[free] = rng.choice(candidates, size=int(free.sum()))
  return tokens, loss_mask


def _bucketed_example(rng, cfg):
  tokens, loss_mask = mqar_example(rng, cfg.seq_len, cfg.mqar_vocab_size, cfg.mqar_num_pairs, cfg.mqar_gap_power,
                                   cfg.mqar_filler)
  queries = np.flatnonzero(loss_mask)
  key_position = {int(tokens[2 * i]): 2 * i for i in range(cfg.mqar_num_pairs)}
  buckets = [distance_bucket(t - key_position[int(tokens[t])]) for t in queries]
  return (tokens, *answers_at(cfg.seq_len, queries, buckets))


@dataclasses.dataclass(frozen=True)
class MQARDataConfig(GeneratedConfig):
  """Generated on the fly (no download): keys from [1, V/2), values from [V/2, V), token 0
  (or random tokens) fills the gaps; query gaps drawn with p(gap) ∝ gap^(power - 1), as in Zoology."""

  kind: ClassVar[str] = "mqar"
  scores_recall: ClassVar[bool] = True

  mqar_vocab_size: int = 8192
  mqar_num_pairs: int = 16
  mqar_gap_power: float = 0.1
  mqar_filler: str = "zero"  # "zero" | "random"

  def __post_init__(self):
    super().__post_init__()
    require(self.mqar_vocab_size >= 4, "data.mqar_vocab_size", "must be >= 4")
    require(self.mqar_num_pairs >= 1, "data.mqar_num_pairs", "must be >= 1")
    require(4 * self.mqar_num_pairs <= self.seq_len, "data.mqar_num_pairs",
            f"{self.mqar_num_pairs} pairs and their queries need seq_len >= {4 * self.mqar_num_pairs}")
    require(self.mqar_num_pairs < self.mqar_vocab_size // 2, "data.mqar_num_pairs",
            "needs fewer pairs than keys (mqar_vocab_size / 2)")
    require_choice(self.mqar_filler, "data.mqar_filler", ("zero", "random"))

  @property
  def vocab_size(self):
    return self.mqar_vocab_size

  @property
  def chance(self):
    return 1.0 / (self.mqar_vocab_size - self.mqar_vocab_size // 2)


def MQARSource(data_config, seed, split):
  """Example i of a split, drawn from an RNG seeded by (seed, split, i)."""
  return GeneratedSource(_bucketed_example, data_config, seed, split)


register_generated(MQARDataConfig, _bucketed_example)

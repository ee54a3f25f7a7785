"""Multi-query associative recall (MQAR, Zoology): the built-in long-context task.

Each example starts with ``num_pairs`` key-value pairs ``k1 v1 k2 v2 ...`` (keys unique, drawn
from [1, V/2); values from [V/2, V)). The rest of the sequence is filler token 0, except that
every key appears once more later as a query, followed by its value. The model is scored only
where the next token is a queried value, so it must recall a pair seen up to seq_len tokens
earlier. Query gaps are power-law: slot s after the pairs has weight (s + 1)^(power - 1).

Our choice where Zoology leaves room: filler is token 0 rather than random tokens, so the only
signal is the pairs; every key is queried exactly once.
"""

import dataclasses
from typing import ClassVar

import numpy as np

from lpcjax.config import DataConfig, require

from .registry import DataKind, register


def mqar_example(rng, seq_len, vocab_size, num_pairs, gap_power):
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
  return tokens, loss_mask


@dataclasses.dataclass(frozen=True)
class MQARDataConfig(DataConfig):
  """Generated on the fly (no download): keys from [1, V/2), values from [V/2, V), token 0
  fills the gaps; query gaps drawn with p(gap) ∝ gap^(power - 1), as in Zoology."""

  kind: ClassVar[str] = "mqar"
  scores_recall: ClassVar[bool] = True
  default_eval_examples: ClassVar[int] = 1024  # generated: it has no end, so score this many

  mqar_vocab_size: int = 8192
  mqar_num_pairs: int = 16
  mqar_gap_power: float = 0.1

  def __post_init__(self):
    super().__post_init__()
    require(self.mqar_vocab_size >= 4, "data.mqar_vocab_size", "must be >= 4")
    require(self.mqar_num_pairs >= 1, "data.mqar_num_pairs", "must be >= 1")
    require(4 * self.mqar_num_pairs <= self.seq_len, "data.mqar_num_pairs",
            f"{self.mqar_num_pairs} pairs and their queries need seq_len >= {4 * self.mqar_num_pairs}")
    require(self.mqar_num_pairs < self.mqar_vocab_size // 2, "data.mqar_num_pairs",
            "needs fewer pairs than keys (mqar_vocab_size / 2)")

  @property
  def vocab_size(self):
    return self.mqar_vocab_size


SPLITS = {"train": 0, "eval": 1}


class MQARSource:
  """Example i is drawn from an RNG seeded by (seed, split, i), so any example can be
  regenerated on any process without generating the ones before it."""

  infinite = True

  def __init__(self, data_config, seed, split):
    self.config, self.seed, self.split_id = data_config, seed, SPLITS[split]

  def __len__(self):
    return 2**31 - 1  # effectively infinite: every index is a fresh example

  def __getitem__(self, index):
    cfg = self.config
    rng = np.random.default_rng([self.seed, self.split_id, index])
    tokens, loss_mask = mqar_example(rng, cfg.seq_len, cfg.mqar_vocab_size, cfg.mqar_num_pairs,
                                     cfg.mqar_gap_power)
    return {"inputs": tokens[:-1], "targets": tokens[1:], "loss_mask": loss_mask}


register(DataKind("mqar", MQARDataConfig, MQARSource, shuffle=False))

"""What the generated (synthetic) data kinds share: the config base and the random-access source.

A generated kind is a function ``example(rng, config) -> (tokens [seq_len + 1], loss_mask
[seq_len], answer_bucket [seq_len])`` and a config class. Inputs are ``tokens[:-1]``, targets
``tokens[1:]``; the loss mask marks the answers (the only scored positions), and
``answer_bucket`` says which difficulty bucket each answer belongs to (a key-query distance, a
number of identifiers, ...; -1 elsewhere), so that the evaluator reports accuracy by bucket
without knowing the task. Example i of a split is drawn from an RNG seeded by (seed, split, i):
any example can be regenerated on any process without the ones before it.

Three splits: ``train``, ``eval`` (the trainer's held-out evaluation; the mechanism suite picks
its learning rate on it) and ``test`` (eval.py ``--split test``: the figures that are reported).
``example_rng`` is that seeding, shared with the generated kinds that are not token tasks
(``synthetic_series``).
"""

import dataclasses
from typing import Callable, ClassVar

import numpy as np

from lpcjax.config import DataConfig, require

from .registry import DataKind, register

SPLITS = {"train": 0, "eval": 1, "test": 2}


def example_rng(seed, split, index):
  """The RNG of example ``index`` of ``split``: a function of (seed, split, index) alone."""
  if split not in SPLITS:
    raise ValueError(f"split {split!r}: generated data has the splits {sorted(SPLITS)}")
  return np.random.default_rng([seed, SPLITS[split], index])


def distance_bucket(distance):
  """2^k for distances in [2^k, 2^(k+1)): the buckets of the recall-by-distance tables."""
  return 1 << int(np.log2(max(int(distance), 1)))


@dataclasses.dataclass(frozen=True)
class GeneratedConfig(DataConfig):
  """Base of the generated kinds. ``task_vocab_size`` (``mqar_vocab_size`` for MQAR) is the
  number of token ids the task uses; each kind says how it splits them into ranges."""

  scores_answers: ClassVar[bool] = True  # the evaluator reports accuracy at the answers
  answer_bucket_name: ClassVar[str] = "key-query distance"
  default_eval_examples: ClassVar[int] = 1024  # generated: it has no end, so score this many

  @property
  def vocab_size(self):
    return self.task_vocab_size

  @property
  def chance(self):
    """Accuracy of a uniform guess among the answers' candidates."""
    raise NotImplementedError

  def evaluation_data(self):
    return f"generated {self.kind} examples of the held-out split (seeded apart from the training examples)"


class GeneratedSource:
  """The examples of one split of a generated kind (``example_fn(rng, config)``)."""

  infinite = True

  def __init__(self, example_fn, data_config, seed, split):
    example_rng(seed, split, 0)  # an unknown split fails here, not at the first example
    self.example_fn, self.config, self.seed, self.split = example_fn, data_config, seed, split

  def __len__(self):
    return 2**31 - 1  # effectively infinite: every index is a fresh example

  def __getitem__(self, index):
    tokens, loss_mask, buckets = self.example_fn(example_rng(self.seed, self.split, index), self.config)
    return {"inputs": tokens[:-1], "targets": tokens[1:], "loss_mask": loss_mask, "answer_bucket": buckets}


def register_generated(config_cls, example_fn: Callable):
  """Register a generated kind: its config class (``kind`` names it) and its example function."""
  make_source = lambda config, seed, split: GeneratedSource(example_fn, config, seed, split)
  return register(DataKind(config_cls.kind, config_cls, make_source, shuffle=False))


def answers_at(seq_len, positions, buckets):
  """(loss_mask [seq_len], answer_bucket [seq_len]) marking ``positions`` with their buckets."""
  loss_mask = np.zeros(seq_len, np.float32)
  answer_bucket = np.full(seq_len, -1, np.int32)
  loss_mask[positions] = 1.0
  answer_bucket[positions] = buckets
  return loss_mask, answer_bucket


def require_vocab(config, needed, why):
  require(config.vocab_size >= needed, "data.task_vocab_size" if hasattr(config, "task_vocab_size")
          else "data.mqar_vocab_size", f"{config.vocab_size} is too small: {why} need {needed}")

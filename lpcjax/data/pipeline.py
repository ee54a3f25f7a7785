"""Grain pipelines over the random-access sources of the data kinds: deterministic given the
seed, sharded by process.

Training reads a kind's source in a seeded shuffled order, epoch after epoch (generated kinds
such as MQAR in index order: every index is already a fresh random example). Evaluation reads
each example once, in order, up to ``max_examples``; its last global batch is filled up with
padding examples, and every evaluation example carries ``valid`` (1.0, or 0.0 for padding) so
that losses and evaluators can ignore the padding: nothing is dropped, every batch has one shape.

Each process takes every process_count-th example (its shard of each global batch), batches
them and prefetches on threads. The iterator's state (Grain's ``get_state``) is saved in every
checkpoint, so a resumed run continues with exactly the batches it would have seen.
"""

import grain
import jax
import numpy as np

from .errors import DataError
from .registry import get as get_kind


class PaddedEvalSource:
  """The first ``max_examples`` examples of ``source`` (all when None), each with ``valid`` = 1,
  then zero-filled examples with ``valid`` = 0 up to a multiple of ``global_batch``."""

  def __init__(self, source, global_batch, max_examples=None):
    if max_examples is None and getattr(source, "infinite", False):
      raise DataError("evaluation: the data is generated without end; give a number of batches "
                      "(train.eval_batches > 0, or --max-examples for eval.py)")
    self.source = source
    self.num_examples = len(source) if max_examples is None else min(len(source), max_examples)
    if self.num_examples == 0:
      raise DataError("evaluation data is empty")
    self.length = -(-self.num_examples // global_batch) * global_batch

  def __len__(self):
    return self.length

  def __getitem__(self, index):
    if index < self.num_examples:
      return {**self.source[index], "valid": np.float32(1.0)}
    padding = {key: np.zeros_like(value) for key, value in self.source[0].items()}
    return {**padding, "valid": np.float32(0.0)}


def make_source(data_config, seed, split):
  return get_kind(data_config.kind).make_source(data_config, seed, split)


def make_dataset(data_config, seed, split, process_index=None, process_count=None, max_examples=None):
  """The batched grain.MapDataset of this process's share of each global batch.

  ``split="eval"`` reads each example once (at most ``max_examples``), padded as described above.
  """
  process_index = jax.process_index() if process_index is None else process_index
  process_count = jax.process_count() if process_count is None else process_count
  batch_size = data_config.batch_size
  if batch_size % process_count:
    raise DataError(f"data.batch_size={batch_size} is not divisible by the {process_count} processes")
  kind = get_kind(data_config.kind)
  source = kind.make_source(data_config, seed, split)
  if split == "train":
    dataset = grain.MapDataset.source(source)
    if kind.shuffle:
      dataset = dataset.shuffle(seed=seed).repeat()
  else:
    dataset = grain.MapDataset.source(PaddedEvalSource(source, batch_size, max_examples))
  dataset = dataset[process_index::process_count]
  return dataset.batch(batch_size // process_count, drop_remainder=True)


def make_iterator(dataset, prefetch=4):
  """A checkpointable iterator (get_state/set_state) with thread prefetching."""
  options = grain.ReadOptions(num_threads=2, prefetch_buffer_size=prefetch)
  return iter(dataset.to_iter_dataset(options))

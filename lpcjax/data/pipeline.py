"""Grain pipelines over random-access sources: deterministic given the seed, sharded by process.

Sources (``len`` + ``__getitem__``):
* ``MQARSource``: example i is drawn from an RNG seeded by (seed, split, i), so any example can
  be regenerated on any process without generating the ones before it.
* ``TokenWindowSource``: window i of a token array is tokens[i*S : i*S + T + 1] (stride S,
  default T); with ``segment_ids`` it also marks the documents inside the window (ids restart
  at 0 per window).

Training reads the windows in a seeded shuffled order, epoch after epoch; evaluation reads them
in order. Each process takes every process_count-th example (its shard of the global batch),
batches them and prefetches on threads. The iterator's state (Grain's ``get_state``) is saved
in every checkpoint, so a resumed run continues with exactly the batches it would have seen.
"""

import grain
import jax
import numpy as np

from .errors import DataError
from .mqar import mqar_example
from .prepare import load_token_file
from .text import tokenize_files
from .tokenizer import load_gpt2_tokenizer

SPLITS = {"train": 0, "eval": 1}


class MQARSource:
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


class TokenWindowSource:
  def __init__(self, tokens, doc_starts, seq_len, segment_ids=False, stride=None):
    self.tokens, self.seq_len, self.segment_ids = tokens, seq_len, segment_ids
    self.stride = stride or seq_len
    self.doc_starts = np.asarray(doc_starts, dtype=np.int64)
    if len(tokens) < seq_len + 1:
      raise DataError(f"data: {len(tokens)} tokens is fewer than seq_len + 1 = {seq_len + 1}")

  def __len__(self):
    return (len(self.tokens) - self.seq_len - 1) // self.stride + 1

  def __getitem__(self, index):
    start = index * self.stride
    window = np.asarray(self.tokens[start:start + self.seq_len + 1], dtype=np.int32)
    example = {"inputs": window[:-1], "targets": window[1:],
               "loss_mask": np.ones(self.seq_len, np.float32)}
    if self.segment_ids:
      # Document index of each input position, relative to the window's first document.
      docs = np.searchsorted(self.doc_starts, np.arange(start, start + self.seq_len), side="right")
      example["segment_ids"] = (docs - docs[0]).astype(np.int32)
    return example


def make_source(data_config, seed, split):
  cfg = data_config
  if cfg.kind == "mqar":
    return MQARSource(cfg, seed, split)
  if cfg.kind == "tokens":
    prefix = cfg.train_tokens if split == "train" else (cfg.eval_tokens or cfg.train_tokens)
    if not prefix:
      raise DataError("data.train_tokens is empty: kind='tokens' needs a prepared token file prefix")
    tokens, meta = load_token_file(prefix)
    return TokenWindowSource(tokens, meta["doc_starts"], cfg.seq_len, cfg.segment_ids, cfg.window_stride)
  files = cfg.train_files if split == "train" else (cfg.eval_files or cfg.train_files)
  if not files:
    raise DataError("data.train_files is empty: kind='text' needs at least one text file")
  tokens, doc_starts = tokenize_files(files, load_gpt2_tokenizer(cfg.tokenizer_file))
  return TokenWindowSource(tokens, doc_starts, cfg.seq_len, cfg.segment_ids, cfg.window_stride)


def make_dataset(data_config, seed, split, process_index=None, process_count=None):
  """The batched grain.MapDataset of this process's share of each global batch."""
  process_index = jax.process_index() if process_index is None else process_index
  process_count = jax.process_count() if process_count is None else process_count
  if data_config.batch_size % process_count:
    raise DataError(f"data.batch_size={data_config.batch_size} is not divisible by the "
                    f"{process_count} processes")
  dataset = grain.MapDataset.source(make_source(data_config, seed, split))
  if split == "train" and data_config.kind != "mqar":
    dataset = dataset.shuffle(seed=seed).repeat()
  dataset = dataset[process_index::process_count]
  return dataset.batch(data_config.batch_size // process_count, drop_remainder=True)


def make_iterator(dataset, prefetch=4):
  """A checkpointable iterator (get_state/set_state) with thread prefetching."""
  options = grain.ReadOptions(num_threads=2, prefetch_buffer_size=prefetch)
  return iter(dataset.to_iter_dataset(options))

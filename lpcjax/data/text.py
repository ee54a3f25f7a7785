"""A minimal text source: files -> GPT-2 tokens -> random (train) or consecutive (eval) windows.

Each file is one document, followed by <|endoftext|>. Gutenberg-style ``.gz`` files are read
as UTF-8 (a BOM is dropped). The training-system issue replaces this with a Grain pipeline over
a prepared token file; the batch format ({inputs, targets, loss_mask}) stays the same.
"""

import gzip
import os

import numpy as np

from .errors import DataError
from .tokenizer import END_OF_TEXT, load_gpt2_tokenizer


def read_text(path):
  if not os.path.isfile(path):
    raise DataError(f"data file not found: {path}")
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt", encoding="utf-8-sig") as f:
    return f.read().replace("\r\n", "\n")


def tokenize_files(paths, tokenizer):
  eot = tokenizer.encode(END_OF_TEXT, allowed_special={END_OF_TEXT})
  ids = []
  for path in paths:
    ids.extend(tokenizer.encode_ordinary(read_text(path)))
    ids.extend(eot)
  return np.asarray(ids, dtype=np.int32)


class TextBatches:
  """Batches of seq_len-token windows; deterministic given (seed, step)."""

  def __init__(self, data_config, seed, split="train"):
    self.config = data_config
    self.seed = seed
    self.split = split
    if not data_config.train_files:
      raise DataError("data.train_files is empty: kind='text' needs at least one text file")
    files = data_config.train_files if split == "train" else (data_config.eval_files or data_config.train_files)
    self.tokens = tokenize_files(files, load_gpt2_tokenizer(data_config.tokenizer_file))
    if len(self.tokens) < data_config.seq_len + 1:
      raise DataError(f"data: {len(self.tokens)} tokens in {files} is fewer than seq_len + 1 = "
                       f"{data_config.seq_len + 1}")

  def batch(self, step):
    cfg = self.config
    window = cfg.seq_len + 1
    if self.split == "train":
      starts = np.random.default_rng([self.seed, step]).integers(0, len(self.tokens) - window + 1, cfg.batch_size)
    else:  # consecutive windows, wrapping around
      num_windows = len(self.tokens) // window
      starts = ((step * cfg.batch_size + np.arange(cfg.batch_size)) % num_windows) * window
    tokens = np.stack([self.tokens[s:s + window] for s in starts])
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
            "loss_mask": np.ones((cfg.batch_size, cfg.seq_len), np.float32)}

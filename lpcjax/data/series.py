"""Time-series classification files: the ``series`` data kind (PMT pre-training and probes).

Files are UCR/UEA ``.tsv`` / ``.tsv.gz`` (a series a row, tab-separated, column 0 the class
label, no header; "NaN", "nan" or an empty field is a missing sample; univariate), UEA ``.ts``
and ``.arff`` (univariate or multivariate; ``series_formats``) or ``.npz`` with ``x`` [N, T, C]
or [N, T] and optional ``y`` [N] (all labels 0 without it). Series of different lengths (the
variable-length sets) are NaN-padded at the end to the longest one; a split's series longer
than the training length are cut to it, with a one-line warning.
Missing samples stay NaN in the examples: the model masks them.

Without ``eval_file``, ``eval_fraction`` of the training file is held out, stratified by class
with ``split_seed`` (not the training seed, so every run and evaluation sees the same split).
Labels are indices into the sorted unique labels of the training file; a file with one class is
fine for pre-training, but a linear probe needs at least two.
"""

import dataclasses
import functools
import gzip
import math
import os
from typing import ClassVar, Optional

import numpy as np

from lpcjax.config import ConfigError, DataConfig, require
from lpcjax.errors import warn

from .errors import DataError
from .registry import DataKind, register
from .series_formats import read_arff, read_ts
from .subsets import stratified_subset

SUFFIXES = (".tsv", ".tsv.gz", ".ts", ".arff", ".npz")


def read_series(path):
  """``(x, raw_labels)``: x float32 [N, T, C] (NaN where missing), raw labels [N]. Cached on
  (path, mtime, size), so the arrays are read-only."""
  path = os.fspath(path)
  try:
    stat = os.stat(path)
  except OSError:
    raise DataError(f"{path}: no such file") from None
  return _read_cached(os.path.abspath(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _read_cached(path, mtime_ns, size):
  del mtime_ns, size  # in the key only: a rewritten file is read again
  if not path.endswith(SUFFIXES):
    raise DataError(f"{path}: unknown extension; expected one of {', '.join(SUFFIXES)}")
  try:
    x, labels = _reader(path)(path)
    labels = _numeric_labels(labels)
  except DataError:
    raise
  except (OSError, EOFError, UnicodeDecodeError, ValueError) as error:  # a .ts/.arff reader's, too
    raise DataError(f"{path}: cannot read: {error}") from None
  if len(x) == 0:
    raise DataError(f"{path}: empty file (no series)")
  empty = np.flatnonzero(np.isnan(x).all(axis=(1, 2)))
  if len(empty):
    raise DataError(f"{path}: series {empty[0]} (0-based) is entirely missing")
  x.flags.writeable = labels.flags.writeable = False
  return x, labels


def _reader(path):
  for suffix, reader in ((".npz", _read_npz), (".ts", read_ts), (".arff", read_arff)):
    if path.endswith(suffix):
      return reader
  return _read_tsv


def _number(text):
  value = float(text) if text.strip() else math.nan
  if math.isinf(value):
    raise ValueError(text)
  return value


def _read_tsv(path):
  opener = gzip.open if path.endswith(".gz") else open
  rows, labels = [], []
  with opener(path, "rt") as f:
    for number, line in enumerate(f, 1):
      fields = line.rstrip().split("\t")  # trailing tabs are not samples
      if fields == [""]:
        continue
      if not fields[0].strip():
        raise DataError(f"{path}: line {number}: the label (column 0) is empty")
      labels.append(fields[0].strip())
      row = []
      for field in fields[1:]:
        try:
          row.append(_number(field))
        except ValueError:
          raise DataError(f"{path}: line {number}: {field!r} is not a finite number or NaN") from None
      rows.append(row)
  x = np.full((len(rows), max(map(len, rows), default=0), 1), np.nan, np.float32)
  for i, row in enumerate(rows):
    x[i, :len(row), 0] = row
  return x, np.array(labels)


def _read_npz(path):
  with np.load(path) as data:
    if "x" not in data.files:
      raise DataError(f"{path}: no array 'x' (has {sorted(data.files)})")
    x = data["x"]
    if x.ndim not in (2, 3):
      raise DataError(f"{path}: x has shape {x.shape}; expected [N, T, C] or [N, T]")
    y = data["y"] if "y" in data.files else np.zeros(len(x), np.int64)
  if y.shape != (len(x),):
    raise DataError(f"{path}: y has shape {y.shape} for {len(x)} series; expected [{len(x)}]")
  x = x.astype(np.float32)
  return (x[:, :, None] if x.ndim == 2 else x), _tidy_labels(y)


def _numeric_labels(labels):
  """Text labels that are all numbers ("1", "-1") as numbers; names stay names."""
  if labels.dtype.kind not in "US":
    return _tidy_labels(labels)
  try:
    return _tidy_labels(labels.astype(np.float64))
  except ValueError:
    return labels


def _tidy_labels(y):
  """Whole-number labels as int64 (UCR writes "1", "-1"), so classes print as "1" not "1.0"."""
  if y.dtype.kind in "biu" or (y.dtype.kind == "f" and np.all(y == np.round(y))):
    return y.astype(np.int64)
  return y


@dataclasses.dataclass(frozen=True)
class SeriesDataConfig(DataConfig):
  """``seq_len`` 0: the longest series of the training file; > 0: every series is cut to its
  first seq_len samples or NaN-padded at the end. ``standardize``: per channel, with the mean
  and std of the training split's observed samples, applied to both splits."""

  kind: ClassVar[str] = "series"

  seq_len: int = 0
  batch_size: int = 16
  train_file: str = ""  # .tsv, .tsv.gz, .ts, .arff or .npz; required (checked when the source is built)
  eval_file: Optional[str] = None  # None: hold out eval_fraction of the training file
  eval_fraction: float = 0.3
  split_seed: int = 0
  standardize: bool = True

  def __post_init__(self):
    # Not DataConfig's checks: seq_len 0 is allowed here. train_file is not required here either:
    # ``data.kind=series`` builds this class before the train_file override is applied.
    require(self.seq_len == 0 or self.seq_len >= 2, "data.seq_len", f"must be 0 or >= 2, got {self.seq_len}")
    require(self.batch_size >= 1, "data.batch_size", f"must be >= 1, got {self.batch_size}")
    require(0 < self.eval_fraction < 1, "data.eval_fraction", f"must be in (0, 1), got {self.eval_fraction}")

  def input_files(self):
    return [(f"data.{field}", path) for field in ("train_file", "eval_file") if (path := getattr(self, field))]

  def evaluation_data(self):
    if self.eval_file:
      return f"series file {self.eval_file}"
    return (f"{self.eval_fraction:.0%} of {self.train_file} held out by class (data.split_seed={self.split_seed}), "
            "never trained on")


def _fit(x, length, file=None):
  """Cut to ``length`` samples or NaN-pad at the end; ``file``: warn when observed samples are cut."""
  if x.shape[1] >= length:
    cut = (~np.isnan(x[:, length:])).any(axis=(1, 2)).sum()
    if file and cut:
      warn(f"{file}: {cut} of {len(x)} series are longer than the training length of {length} samples and are "
           "cut to it (set data.seq_len to choose the length)")
    return x[:, :length]
  return np.concatenate([x, np.full((len(x), length - x.shape[1], x.shape[2]), np.nan, np.float32)], 1)


def _statistics(x):
  """Per-channel mean and std [C] of the observed samples (an all-missing channel: 0 and 1)."""
  observed = ~np.isnan(x)
  count = np.maximum(observed.sum(axis=(0, 1)), 1)
  mean = np.where(observed, x, 0).sum(axis=(0, 1), dtype=np.float64) / count
  var = np.where(observed, (x - mean) ** 2, 0).sum(axis=(0, 1), dtype=np.float64) / count
  return mean, np.maximum(np.sqrt(var), 1e-8)


class SeriesSource:
  """One split: ``x`` [N, T, C] float32 (standardized, NaN kept), ``labels`` int32 [N] indexing
  ``classes`` (the training file's raw labels as strings), ``mean`` and ``std`` [C]."""

  def __init__(self, config, seed, split):
    del seed  # the held-out split uses config.split_seed
    if split not in ("train", "eval"):
      raise DataError(f"data: unknown split {split!r}; a series file has 'train' and 'eval' (its eval_file)")
    if not config.train_file:
      raise ConfigError("data.train_file: required: a file ending in " + ", ".join(SUFFIXES))
    x, raw = read_series(config.train_file)
    classes = np.unique(raw)
    length = config.seq_len or x.shape[1]
    if config.eval_file is None:
      held_out = np.zeros(len(raw), bool)
      held_out[stratified_subset(raw, config.eval_fraction, config.split_seed)] = True
      if held_out.all():
        raise DataError(f"{config.train_file}: holding out eval_fraction={config.eval_fraction} "
                        f"of {len(raw)} series leaves none for training")
      train_x = x[~held_out]
      rows = held_out if split == "eval" else ~held_out
      x, raw, file = x[rows], raw[rows], config.train_file
    else:
      train_x = x
      if split == "eval":
        x, raw = read_series(config.eval_file)
      file = config.train_file if split == "train" else config.eval_file
    x, train_x = _fit(x, length, file if split == "eval" or config.seq_len else None), _fit(train_x, length)
    channels = train_x.shape[2]
    if x.shape[2] != channels:
      raise DataError(f"{file}: {x.shape[2]} channels, but the training file has {channels}")
    mean, std = _statistics(train_x) if config.standardize else (np.zeros(channels), np.ones(channels))
    self.x = ((x - mean) / std).astype(np.float32)
    self.mean, self.std = mean.astype(np.float32), std.astype(np.float32)
    index = {label: i for i, label in enumerate(classes.tolist())}
    unseen = [label for label in raw.tolist() if label not in index]
    if unseen:
      raise DataError(f"{file}: label {unseen[0]!r} does not occur in the training file {config.train_file}")
    self.labels = np.array([index[label] for label in raw.tolist()], np.int32)
    self.classes = tuple(str(label) for label in classes.tolist())
    self.num_channels, self.num_classes = channels, len(classes)

  def __len__(self):
    return len(self.x)

  def __getitem__(self, index):
    return {"x": self.x[index], "label": self.labels[index]}


register(DataKind("series", SeriesDataConfig, SeriesSource))

"""GPT-2 token windows: the ``text`` and ``tokens`` data kinds.

``text``: text files (.txt, .gz, .jsonl) tokenized in memory when the run starts (small corpora).
``tokens``: a flat uint16 token file made once by ``python -m lpcjax.data`` (memmapped).
Window i of the token stream is tokens[i*S : i*S + T + 1] (stride S, default T); with
``segment_ids`` it also marks the documents inside the window (ids restart at 0 per window).
"""

import dataclasses
import json
import os
from typing import ClassVar, Optional

import numpy as np

from lpcjax.config import DataConfig, listed, require

from .errors import DataError
from .prepare import load_token_file, read_documents, tokenizer_hash
from .registry import DataKind, register
from .text import tokenize_files
from .tokenizer import ENV_VAR, SHIPPED_RANK_FILE, is_shipped_copy, load_gpt2_tokenizer, rank_file_in_use

GPT2_VOCAB_SIZE = 50257


@dataclasses.dataclass(frozen=True)
class TokenWindowConfig(DataConfig):
  """Fields shared by the GPT-2 token kinds."""

  tokenizer_file: Optional[str] = None  # tiktoken rank file; else $LPCJAX_TIKTOKEN_FILE; else the shipped one
  segment_ids: bool = False  # give the model the document boundaries inside a window
  window_stride: Optional[int] = None  # start of window i is i * stride (default seq_len)

  def __post_init__(self):
    super().__post_init__()
    require(self.window_stride is None or self.window_stride >= 1, "data.window_stride", "must be >= 1")

  is_text_stream: ClassVar[bool] = True

  @property
  def vocab_size(self):
    return GPT2_VOCAB_SIZE

  def for_evaluation(self, seq_len, batch_size):
    # long sequences, no stride: windowed models (sith) slide over them themselves
    return dataclasses.replace(self, seq_len=seq_len, batch_size=batch_size, window_stride=None)


@dataclasses.dataclass(frozen=True)
class TextDataConfig(TokenWindowConfig):
  kind: ClassVar[str] = "text"

  train_files: tuple[str, ...] = ()
  eval_files: tuple[str, ...] = ()  # default: the training files

  @property
  def evaluation_files(self):
    return self.eval_files or self.train_files

  def input_files(self):
    # (not the tokenizer file: its loader says more, and may read this install's copy of a
    # shipped file that a run recorded in another)
    return [*(("data.train_files", path) for path in self.train_files),
            *(("data.eval_files", path) for path in self.eval_files)]

  def evaluation_data(self):
    if self.eval_files:
      return f"text {listed(self.eval_files)}"
    return (f"the training text ({listed(self.train_files)}; no data.eval_files): its loss there is a training "
            "loss, not a held-out one")

  def tokens_per_word(self):
    tokens, _ = tokenize_files(self.evaluation_files, load_gpt2_tokenizer(self.tokenizer_file))
    words = sum(len(text.split()) for path in self.evaluation_files for text in read_documents(path))
    return len(tokens) / words if words else None

  def text_tokens(self, tokenizer):
    return tokenize_files(self.evaluation_files, tokenizer)[0] if self.evaluation_files else None


@dataclasses.dataclass(frozen=True)
class TokenFileConfig(TokenWindowConfig):
  kind: ClassVar[str] = "tokens"

  train_tokens: Optional[str] = None  # prefix of PREFIX.bin/PREFIX.json
  eval_tokens: Optional[str] = None  # default: the training tokens

  @property
  def evaluation_tokens(self):
    return self.eval_tokens or self.train_tokens

  missing_file_hint: ClassVar[str] = " (make it with python -m lpcjax.data)"

  def input_files(self):
    prefixes = [(field, getattr(self, field)) for field in ("train_tokens", "eval_tokens") if getattr(self, field)]
    return [(f"data.{field}", f"{prefix}{suffix}") for field, prefix in prefixes for suffix in (".json", ".bin")]

  def evaluation_data(self):
    if self.eval_tokens:
      return f"token file {self.eval_tokens}"
    return (f"the training tokens ({self.train_tokens}; no data.eval_tokens): its loss there is a training loss, "
            "not a held-out one")

  def tokens_per_word(self):
    _, meta = load_token_file(self.evaluation_tokens)
    return meta["num_tokens"] / meta["num_words"] if meta.get("num_words") else None

  def text_tokens(self, tokenizer):
    return load_token_file(self.evaluation_tokens)[0]

  def check_tokenizer(self):
    _, meta = load_token_file(self.evaluation_tokens)
    if meta.get("tokenizer_sha256") != tokenizer_hash(load_gpt2_tokenizer(self.tokenizer_file)):
      raise DataError(f"tokenizer mismatch: {self.evaluation_tokens} was prepared with another tokenizer")


def with_tokenizer(data, tokenizer_file=None, saved=False):
  """``data`` with ``tokenizer_file`` set to the rank file its tokenizer is read from, as an
  absolute path; the one rule of every command (train.py, eval.py, generate): ``tokenizer_file``
  (a command's --tokenizer-file), else the config's own, else $LPCJAX_TIKTOKEN_FILE, else (token
  files) the one ``python -m lpcjax.data`` recorded, else the GPT-2 rank file lpcjax ships. ``saved``: the
  config comes from a run directory, maybe written on another machine, so a recorded file that
  is gone gives way to $LPCJAX_TIKTOKEN_FILE. A run saves the result in config.json, so eval.py
  and generate find the tokenizer offline. Other data kinds have no tokenizer and come back as
  they are."""
  if not isinstance(data, TokenWindowConfig):
    return data
  chosen = tokenizer_file or data.tokenizer_file
  if saved and not tokenizer_file and chosen and is_shipped_copy(chosen):
    chosen = SHIPPED_RANK_FILE  # recorded by another install of lpcjax: this one's copy
  if saved and not tokenizer_file and chosen and not os.path.isfile(chosen) and os.environ.get(ENV_VAR):
    chosen = None
  chosen = chosen or os.environ.get(ENV_VAR)
  if chosen is None and isinstance(data, TokenFileConfig) and data.train_tokens:
    try:  # only a hint: a missing or older token file fails later, where it is read
      with open(f"{data.train_tokens}.json") as f:
        chosen = json.load(f).get("tokenizer_file")
    except (OSError, ValueError, AttributeError):
      pass
  return dataclasses.replace(data, tokenizer_file=rank_file_in_use(chosen))


class TooShortError(DataError):
  """Fewer tokens than one window needs; ``num_tokens`` says how many there are."""

  def __init__(self, message, num_tokens):
    super().__init__(message)
    self.num_tokens = num_tokens


class TokenWindowSource:
  def __init__(self, tokens, doc_starts, seq_len, segment_ids=False, stride=None):
    self.tokens, self.seq_len, self.segment_ids = tokens, seq_len, segment_ids
    self.stride = stride or seq_len
    self.doc_starts = np.asarray(doc_starts, dtype=np.int64)
    if len(tokens) < seq_len + 1:
      raise TooShortError(f"{len(tokens)} tokens, fewer than one window needs (seq_len + 1 = {seq_len + 1})",
                          len(tokens))

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


def text_source(cfg, seed, split):
  del seed
  files = cfg.train_files if split == "train" else (cfg.eval_files or cfg.train_files)
  if not files:
    raise DataError("data.train_files is empty: kind='text' needs at least one text file")
  tokens, doc_starts = tokenize_files(files, load_gpt2_tokenizer(cfg.tokenizer_file))
  return _windows(tokens, doc_starts, cfg, f"{listed(files)} ({'data.train_files' if split == 'train' else 'eval'})")


def _windows(tokens, doc_starts, cfg, what):
  """The windows of ``tokens``; too few of them for one window is a TooShortError naming ``what``."""
  try:
    return TokenWindowSource(tokens, doc_starts, cfg.seq_len, cfg.segment_ids, cfg.window_stride)
  except TooShortError as error:
    raise TooShortError(f"{what}: {error}", error.num_tokens) from None


def token_file_source(cfg, seed, split):
  del seed
  prefix = cfg.train_tokens if split == "train" else (cfg.eval_tokens or cfg.train_tokens)
  if not prefix:
    raise DataError("data.train_tokens is empty: kind='tokens' needs a prepared token file prefix")
  tokens, meta = load_token_file(prefix)
  return _windows(tokens, meta["doc_starts"], cfg, f"token file {prefix}")


register(DataKind("text", TextDataConfig, text_source))
register(DataKind("tokens", TokenFileConfig, token_file_source))

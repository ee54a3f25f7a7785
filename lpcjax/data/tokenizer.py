"""The GPT-2 tokenizer through tiktoken, from a rank file: offline, with no setup.

Order of lookup: the ``rank_file`` argument (a command's ``--tokenizer-file``, or the run's
recorded ``data.tokenizer_file``), then the environment variable ``LPCJAX_TIKTOKEN_FILE``, then
the GPT-2 rank file lpcjax ships (``gpt2.tiktoken.gz`` beside this module: tiktoken's r50k_base
ranks, MIT, OpenAI). lpcjax never downloads it: tiktoken's download needs a network and a
writable cache, and the shipped file holds the same ranks (the same ``tokenizer_hash``), so a
run is the same offline and online. A rank file is one ``base64(token) rank`` per line
(tiktoken's format), plain or gzipped.
"""

import base64
import binascii
import gzip
import os
import zlib

import tiktoken

from .errors import DataError

GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
END_OF_TEXT = "<|endoftext|>"
ENV_VAR = "LPCJAX_TIKTOKEN_FILE"
SHIPPED_RANK_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt2.tiktoken.gz")
# Every command takes the same flag: the error says so rather than name a config field that
# eval.py and generate cannot set.
OFFLINE_HINT = ("pass --tokenizer-file FILE (train.py, eval.py, python -m lpcjax.generate, lpcjax.data, "
                f"lpcjax.convert) or set ${ENV_VAR}, FILE a tiktoken rank file such as gpt2.tiktoken, or give "
                "neither for the GPT-2 rank file lpcjax ships")


class TokenizerError(DataError):
  pass


def _ranks(rank_file):
  """{token bytes: rank} of a tiktoken rank file, plain or gzipped."""
  opener = gzip.open if rank_file.endswith(".gz") else open
  with opener(rank_file, "rb") as f:
    lines = f.read().splitlines()
  return {base64.b64decode(token, validate=True): int(rank) for token, rank in (line.split() for line in lines if line)}


def load_gpt2_tokenizer(rank_file=None):
  rank_file = rank_file_in_use(rank_file)
  if not os.path.isfile(rank_file):
    raise TokenizerError(f"tokenizer rank file not found: {rank_file}; {OFFLINE_HINT}")
  try:
    ranks = _ranks(rank_file)
  except (OSError, ValueError, binascii.Error, EOFError, zlib.error) as error:  # not gzip/base64/"token rank"
    raise TokenizerError(f"tokenizer rank file {rank_file} is not a tiktoken rank file: {error}") from None
  if not ranks:
    raise TokenizerError(f"tokenizer rank file {rank_file} is not a tiktoken rank file: it is empty")
  return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                           special_tokens={END_OF_TEXT: len(ranks)})


def rank_file_in_use(rank_file=None):
  """The absolute path of the rank file ``load_gpt2_tokenizer(rank_file)`` reads: what a run or
  a token file records so that later commands read the same one."""
  return os.path.abspath(rank_file or os.environ.get(ENV_VAR) or SHIPPED_RANK_FILE)


def is_shipped_copy(rank_file):
  """Whether a recorded ``rank_file`` is the shipped file of another install, gone from here (a
  run trained elsewhere): it reads this install's."""
  return (os.path.basename(rank_file) == os.path.basename(SHIPPED_RANK_FILE) and not os.path.isfile(rank_file)
          and os.path.basename(os.path.dirname(rank_file)) == "data")

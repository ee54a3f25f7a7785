"""The GPT-2 tokenizer through tiktoken, loadable offline from a rank file.

Order of lookup: the ``rank_file`` argument (a command's ``--tokenizer-file``, or the run's
recorded ``data.tokenizer_file``), then the environment variable ``LPCJAX_TIKTOKEN_FILE``, then
tiktoken's own download of "gpt2". A rank file is one ``base64(token) rank`` per line
(tiktoken's format; GPT-2's is tiktoken's r50k_base file).
"""

import os

import tiktoken
import tiktoken.load

from .errors import DataError

GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
END_OF_TEXT = "<|endoftext|>"
ENV_VAR = "LPCJAX_TIKTOKEN_FILE"
# Every command takes the same flag: the error says so rather than name a config field that
# eval.py and generate cannot set.
OFFLINE_HINT = ("offline, pass --tokenizer-file FILE (train.py, eval.py, "
                "python -m lpcjax.generate, lpcjax.data, lpcjax.convert) or set "
                f"${ENV_VAR}, FILE a tiktoken rank file "
                "such as gpt2.tiktoken")


class TokenizerError(DataError):
  pass


def load_gpt2_tokenizer(rank_file=None):
  rank_file = rank_file or os.environ.get(ENV_VAR)
  if rank_file:
    if not os.path.isfile(rank_file):
      raise TokenizerError(f"tokenizer rank file not found: {rank_file}; {OFFLINE_HINT}")
    try:
      ranks = tiktoken.load.load_tiktoken_bpe(rank_file)
    except Exception as error:  # tiktoken raises several types for a malformed file
      raise TokenizerError(f"tokenizer rank file {rank_file} is not a tiktoken rank file: {error}") from None
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={END_OF_TEXT: len(ranks)})
  try:
    return tiktoken.get_encoding("gpt2")
  except Exception as error:
    raise TokenizerError(f"could not download the GPT-2 tokenizer ({type(error).__name__}); "
                         f"{OFFLINE_HINT}") from None


def rank_file_in_use(rank_file=None):
  """The absolute path of the rank file ``load_gpt2_tokenizer(rank_file)`` reads, or None when
  it would download: what a run or a token file records so that later commands find it offline."""
  rank_file = rank_file or os.environ.get(ENV_VAR)
  return os.path.abspath(rank_file) if rank_file else None

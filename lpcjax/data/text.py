"""Text files -> GPT-2 tokens in memory (data.kind="text": small corpora, no preparation step).

Each file is one document (read like ``prepare.read_documents``: .gz and .jsonl work too),
followed by <|endoftext|>. For large corpora prepare a token file once instead
(``python -m lpcjax.data``, data.kind="tokens").
"""

import numpy as np

from .errors import DataError
from .prepare import read_documents
from .tokenizer import END_OF_TEXT


def tokenize_files(paths, tokenizer):
  """(int32 tokens, document start offsets) of the files' documents, in order."""
  eot = tokenizer.encode(END_OF_TEXT, allowed_special={END_OF_TEXT})
  ids, doc_starts = [], []
  for path in paths:
    empty = True
    for text in read_documents(path):
      empty = empty and not text.strip()
      doc_starts.append(len(ids))
      ids.extend(tokenizer.encode_ordinary(text))
      ids.extend(eot)
    if empty:  # else it would count as one end-of-text token, and the error would blame the length
      raise DataError(f"{path} is empty: no text to read")
  return np.asarray(ids, dtype=np.int32), doc_starts

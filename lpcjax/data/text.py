"""Text files -> GPT-2 tokens in memory (data.kind="text": small corpora, no preparation step).

Each file is one document (read like ``prepare.read_documents``: .gz and .jsonl work too),
followed by <|endoftext|>. For large corpora prepare a token file once instead
(``python -m lpcjax.data``, data.kind="tokens").
"""

import numpy as np

from .prepare import read_documents
from .tokenizer import END_OF_TEXT


def tokenize_files(paths, tokenizer):
  """(int32 tokens, document start offsets) of the files' documents, in order."""
  eot = tokenizer.encode(END_OF_TEXT, allowed_special={END_OF_TEXT})
  ids, doc_starts = [], []
  for path in paths:
    for text in read_documents(path):
      doc_starts.append(len(ids))
      ids.extend(tokenizer.encode_ordinary(text))
      ids.extend(eot)
  return np.asarray(ids, dtype=np.int32), doc_starts

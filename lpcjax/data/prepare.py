"""Turn text into a flat uint16 GPT-2 token file plus a metadata JSON.

  python -m lpcjax.data OUT_PREFIX INPUT [INPUT ...] [--tokenizer-file gpt2.tiktoken]

Inputs: plain text (.txt, anything else read as UTF-8), gzip of it (.gz), or JSONL (.jsonl,
.jsonl.gz; one document per line in its "text" field). A plain-text file is one document.
Documents are separated by <|endoftext|>. Writes OUT_PREFIX.bin (uint16 tokens) and
OUT_PREFIX.json: token, document and whitespace-word counts, document start offsets, the
tokenizer's hash, each source's size and modification time, and the .bin's size and sha256.
Both are written to temporary names and renamed when complete, so an interrupted run leaves
nothing that looks finished; re-running with the same inputs and tokenizer does nothing when
the .bin on disk still has its recorded size and checksum, and rebuilds it otherwise.
"""

import argparse
import gzip
import hashlib
import json
import os
import sys

import numpy as np
from tqdm.auto import tqdm

from lpcjax import cli

from .errors import DataError
from .tokenizer import END_OF_TEXT, load_gpt2_tokenizer, rank_file_in_use

FORMAT_VERSION = 2  # 2: the metadata records the .bin's size and sha256


def tokenizer_hash(tokenizer):
  """sha256 over the merge ranks and special tokens: identifies the tokenizer, not its file."""
  digest = hashlib.sha256()
  for token, rank in sorted(tokenizer._mergeable_ranks.items(), key=lambda item: item[1]):
    digest.update(token + b"\x00" + str(rank).encode() + b"\n")
  digest.update(json.dumps(sorted(tokenizer._special_tokens.items())).encode())
  return digest.hexdigest()


def read_documents(path):
  """Yield the documents of one input file as strings."""
  if not os.path.isfile(path):
    raise DataError(f"data file not found: {path}")
  opener = gzip.open if path.endswith(".gz") else open
  is_jsonl = path.removesuffix(".gz").endswith(".jsonl")
  try:
    with opener(path, "rt", encoding="utf-8-sig") as f:
      if not is_jsonl:
        yield f.read().replace("\r\n", "\n")
        return
      for number, line in enumerate(f, 1):
        if line.strip():
          record = json.loads(line)
          if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise DataError(f"{path}:{number}: a JSONL line needs a string field 'text'")
          yield record["text"]
  except (UnicodeDecodeError, OSError, json.JSONDecodeError) as error:
    raise DataError(f"cannot read {path}: {error}") from None


def file_sha256(path, chunk=1 << 24):
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    while block := f.read(chunk):
      digest.update(block)
  return digest.hexdigest()


def is_complete(meta_path, bin_path, expected):
  """Whether an earlier run left this exact output: same inputs and tokenizer in the metadata,
  and a .bin whose size and checksum are the recorded ones (a truncated or altered file is not)."""
  if not (os.path.exists(meta_path) and os.path.exists(bin_path)):
    return None
  try:
    with open(meta_path) as f:
      existing = json.load(f)
  except json.JSONDecodeError:
    return None
  if any(existing.get(key) != value for key, value in expected.items()):
    return None
  if os.path.getsize(bin_path) != existing.get("bin_bytes") or file_sha256(bin_path) != existing.get("bin_sha256"):
    return None
  return existing


def source_fingerprint(paths):
  return [{"path": os.path.abspath(p), "bytes": os.path.getsize(p), "mtime": os.path.getmtime(p)}
          for p in paths]


def prepare(out_prefix, inputs, tokenizer_file=None, progress=True):
  """Tokenize ``inputs`` into OUT_PREFIX.bin/.json; returns the metadata dict."""
  for path in inputs:
    if not os.path.isfile(path):
      raise DataError(f"data file not found: {path}")
  tokenizer = load_gpt2_tokenizer(tokenizer_file)
  if tokenizer.n_vocab > 2**16:
    raise DataError(f"tokenizer has {tokenizer.n_vocab} tokens: more than uint16 holds")
  meta_path, bin_path = f"{out_prefix}.json", f"{out_prefix}.bin"
  expected = {"format_version": FORMAT_VERSION, "tokenizer_sha256": tokenizer_hash(tokenizer),
              "sources": source_fingerprint(inputs)}
  existing = is_complete(meta_path, bin_path, expected)
  if existing is not None:
    return existing  # idempotent: same inputs, same tokenizer, intact output

  eot = tokenizer.encode(END_OF_TEXT, allowed_special={END_OF_TEXT})
  doc_starts, total, words, digest = [], 0, 0, hashlib.sha256()
  tmp_bin = f"{bin_path}.tmp"
  os.makedirs(os.path.dirname(os.path.abspath(out_prefix)), exist_ok=True)
  try:
    with open(tmp_bin, "wb") as out, tqdm(inputs, desc="tokenizing", unit="file", disable=not progress) as bar:
      for path in bar:
        for text in read_documents(path):
          ids = np.asarray(tokenizer.encode_ordinary(text) + eot, dtype=np.uint16)
          doc_starts.append(total)
          total += len(ids)
          words += len(text.split())
          out.write(ids.tobytes())
          digest.update(ids.tobytes())
        bar.set_postfix(tokens=total)
    meta = {**expected, "num_tokens": total, "num_documents": len(doc_starts), "num_words": words,
            "doc_starts": doc_starts, "vocab_size": tokenizer.n_vocab, "dtype": "uint16",
            "bin_bytes": 2 * total, "bin_sha256": digest.hexdigest(),
            # where the tokenizer came from (not part of the identity: the hash is), so that a run
            # trained on these tokens finds it offline
            "tokenizer_file": rank_file_in_use(tokenizer_file)}
    tmp_meta = f"{meta_path}.tmp"
    with open(tmp_meta, "w") as f:
      json.dump(meta, f)
    os.replace(tmp_bin, bin_path)  # the .bin first: a .json only ever describes a complete .bin
    os.replace(tmp_meta, meta_path)
  finally:
    if os.path.exists(tmp_bin):
      os.remove(tmp_bin)
  return meta


def load_token_file(out_prefix):
  """(memmap of uint16 tokens, metadata) after checking that the two agree."""
  meta_path, bin_path = f"{out_prefix}.json", f"{out_prefix}.bin"
  for path in (meta_path, bin_path):
    if not os.path.isfile(path):
      raise DataError(f"token file not found: {path} (make it with python -m lpcjax.data)")
  try:
    with open(meta_path) as f:
      meta = json.load(f)
  except json.JSONDecodeError as error:
    raise DataError(f"corrupt token metadata {meta_path}: {error}") from None
  expected_bytes = 2 * meta.get("num_tokens", -1)
  actual = os.path.getsize(bin_path)
  if actual != expected_bytes:
    raise DataError(f"token file {bin_path} has {actual} bytes, its metadata says {expected_bytes}: "
                    "truncated or corrupt; prepare it again")
  return np.memmap(bin_path, dtype=np.uint16, mode="r"), meta


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("out_prefix", help="writes OUT_PREFIX.bin and OUT_PREFIX.json")
  parser.add_argument("inputs", nargs="+", help=".txt, .gz, .jsonl or .jsonl.gz files")
  parser.add_argument("--tokenizer-file", default=None, help="tiktoken rank file (offline use)")
  args = parser.parse_args(argv)
  meta = cli.exit_status(lambda: prepare(args.out_prefix, args.inputs, args.tokenizer_file))
  if meta == cli.USAGE_ERROR:
    return meta
  print(f"{meta['num_tokens']} tokens in {meta['num_documents']} documents -> {args.out_prefix}.bin")
  return 0


if __name__ == "__main__":
  sys.exit(main())

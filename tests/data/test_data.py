import dataclasses
import gzip
import json
import subprocess
import sys

import numpy as np
import pytest

from lpcjax.data import (DataError, MQARDataConfig, MQARSource, TokenWindowSource, load_gpt2_tokenizer, load_token_file,
                         make_dataset, make_iterator, mqar_example, prepare)

from conftest import BOOK


def test_mqar_answers_are_the_paired_values():
  rng = np.random.default_rng(0)
  tokens, mask = mqar_example(rng, seq_len=128, vocab_size=256, num_pairs=8, gap_power=0.1)
  pairs = dict(zip(tokens[0:16:2], tokens[1:16:2]))
  assert len(pairs) == 8 and all(1 <= k < 128 for k in pairs) and all(128 <= v < 256 for v in pairs.values())
  inputs, targets = tokens[:-1], tokens[1:]
  answered = np.flatnonzero(mask)
  assert len(answered) == 8 and sorted(inputs[answered]) == sorted(pairs)
  for t in answered:
    assert t >= 16 and targets[t] == pairs[inputs[t]]


def test_mqar_examples_depend_only_on_seed_split_and_index():
  cfg = MQARDataConfig(seq_len=64, batch_size=4, mqar_vocab_size=256, mqar_num_pairs=4)
  a, b = MQARSource(cfg, 1, "train")[5], MQARSource(cfg, 1, "train")[5]
  np.testing.assert_array_equal(a["inputs"], b["inputs"])
  assert not np.array_equal(a["inputs"], MQARSource(cfg, 1, "train")[6]["inputs"])
  assert not np.array_equal(a["inputs"], MQARSource(cfg, 1, "eval")[5]["inputs"])
  np.testing.assert_array_equal(a["inputs"][1:], a["targets"][:-1])


def test_processes_read_disjoint_halves_of_each_global_batch():
  cfg = MQARDataConfig(seq_len=32, batch_size=4, mqar_vocab_size=64, mqar_num_pairs=2)
  whole = next(make_iterator(make_dataset(cfg, 0, "train", 0, 1)))["inputs"]
  halves = [next(make_iterator(make_dataset(cfg, 0, "train", p, 2)))["inputs"] for p in (0, 1)]
  assert halves[0].shape == (2, 32)
  np.testing.assert_array_equal(np.concatenate([halves[0], halves[1]])[[0, 2, 1, 3]], whole)
  with pytest.raises(DataError, match="not divisible by the 3 processes"):
    make_dataset(cfg, 0, "train", 0, 3)


def test_iterator_state_restores_the_position():
  cfg = MQARDataConfig(seq_len=32, batch_size=2, mqar_vocab_size=64, mqar_num_pairs=2)
  it = make_iterator(make_dataset(cfg, 0, "train"))
  next(it), next(it)
  state = it.get_state()
  expected = next(it)["inputs"]
  again = make_iterator(make_dataset(cfg, 0, "train"))
  again.set_state(state)
  np.testing.assert_array_equal(next(again)["inputs"], expected)


def test_token_windows_and_segment_ids():
  tokens = np.arange(20, dtype=np.uint16)
  source = TokenWindowSource(tokens, doc_starts=[0, 6, 13], seq_len=4, segment_ids=True)
  assert len(source) == 4
  window = source[1]  # inputs are positions 4..7: documents 0, 0, 1, 1
  np.testing.assert_array_equal(window["inputs"], [4, 5, 6, 7])
  np.testing.assert_array_equal(window["targets"], [5, 6, 7, 8])
  np.testing.assert_array_equal(window["segment_ids"], [0, 0, 1, 1])


def test_tokenizer_offline_from_rank_file(gpt2_rank_file, monkeypatch):
  enc = load_gpt2_tokenizer(gpt2_rank_file)
  assert enc.encode("Hello world") == [15496, 995] and enc.n_vocab == 50257
  assert enc.encode("<|endoftext|>", allowed_special="all") == [50256]
  monkeypatch.setenv("LPCJAX_TIKTOKEN_FILE", gpt2_rank_file)
  assert load_gpt2_tokenizer().encode("Hello world") == [15496, 995]


def test_tokenizer_errors_are_clear(tmp_path):
  with pytest.raises(DataError, match="tokenizer rank file not found"):
    load_gpt2_tokenizer(str(tmp_path / "missing.tiktoken"))
  bad = tmp_path / "bad.tiktoken"
  bad.write_text("not a rank file\n")
  with pytest.raises(DataError, match="not a tiktoken rank file"):
    load_gpt2_tokenizer(str(bad))


def test_prepare_round_trip_idempotent_and_checked(gpt2_rank_file, tmp_path):
  rank_file = gpt2_rank_file
  book = str(BOOK)  # gzip of UTF-8 with a BOM and CRLF, as Project Gutenberg stores its books
  jsonl = tmp_path / "docs.jsonl"
  jsonl.write_text(json.dumps({"text": "First document."}) + "\n" + json.dumps({"text": "Second, café."}) + "\n")
  prefix = str(tmp_path / "out" / "tokens")
  meta = prepare(prefix, [book, str(jsonl)], rank_file, progress=False)
  enc = load_gpt2_tokenizer(rank_file)
  with gzip.open(book, "rt", encoding="utf-8-sig") as f:
    text = f.read().replace("\r\n", "\n")
  tokens, loaded = load_token_file(prefix)
  tokens = np.array(tokens)  # a copy: the memmapped file is rewritten below
  assert meta["num_documents"] == 3 and loaded["num_tokens"] == len(tokens) == meta["num_tokens"]
  first_len = len(enc.encode_ordinary(text)) + 1
  assert meta["doc_starts"] == [0, first_len, first_len + len(enc.encode_ordinary("First document.")) + 1]
  assert enc.decode(tokens[:first_len - 1].tolist()) == text and tokens[first_len - 1] == 50256
  assert enc.decode(tokens[meta["doc_starts"][2]:-1].tolist()) == "Second, café."
  mtime = (tmp_path / "out" / "tokens.bin").stat().st_mtime_ns
  prepare(prefix, [book, str(jsonl)], rank_file, progress=False)  # same inputs: nothing rewritten
  assert (tmp_path / "out" / "tokens.bin").stat().st_mtime_ns == mtime
  with open(f"{prefix}.bin", "r+b") as f:
    f.truncate(100)
  with pytest.raises(DataError, match="truncated or corrupt"):
    load_token_file(prefix)
  prepare(prefix, [book, str(jsonl)], rank_file, progress=False)  # as the error advises: rebuilt
  np.testing.assert_array_equal(load_token_file(prefix)[0], tokens)
  with open(f"{prefix}.bin", "r+b") as f:  # same size, one token altered: the checksum sees it
    f.seek(10)
    f.write(b"\xff\xff")
  prepare(prefix, [book, str(jsonl)], rank_file, progress=False)
  np.testing.assert_array_equal(load_token_file(prefix)[0], tokens)
  with pytest.raises(DataError, match="token file not found"):
    load_token_file(str(tmp_path / "nothing"))


def test_prepare_cli_errors_in_one_line(tmp_path):
  result = subprocess.run([sys.executable, "-m", "lpcjax.data", str(tmp_path / "t"),
                           str(tmp_path / "missing.txt")], capture_output=True, text=True)
  assert result.returncode == 2 and result.stderr.strip() == f"error: data file not found: {tmp_path / 'missing.txt'}"
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"title": "no text"}\n')
  result = subprocess.run([sys.executable, "-m", "lpcjax.data", str(tmp_path / "t"), str(bad),
                           "--tokenizer-file", "/nonexistent"], capture_output=True, text=True)
  assert result.returncode == 2 and "tokenizer rank file not found" in result.stderr
  assert not list(tmp_path.glob("t.*"))  # nothing half-written


def test_an_empty_or_short_text_file_is_named(tmp_path, gpt2_rank_file):
  """A 0-byte file is "empty", not "1 tokens"; too little text names the files and the split."""
  from lpcjax.data import make_dataset
  from lpcjax.data.windows import TextDataConfig
  (tmp_path / "empty.txt").write_text("")
  (tmp_path / "short.txt").write_text("Only a few words here.")
  config = TextDataConfig(seq_len=256, batch_size=1, tokenizer_file=gpt2_rank_file,
                          train_files=(str(tmp_path / "empty.txt"),))
  with pytest.raises(DataError, match=rf"^{tmp_path / 'empty.txt'} is empty: no text to read$"):
    make_dataset(config, 0, "train")
  short = dataclasses.replace(config, train_files=(str(tmp_path / "short.txt"),))
  with pytest.raises(DataError, match=rf"^{tmp_path / 'short.txt'} \(data.train_files\): 7 tokens, fewer than one "
                                      r"window needs \(seq_len \+ 1 = 257\)$"):
    make_dataset(short, 0, "train")

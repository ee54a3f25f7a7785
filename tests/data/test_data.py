import gzip

import numpy as np
import pytest

from lpcjax.config import DataConfig
from lpcjax.data import DataError, MQARBatches, TextBatches, load_gpt2_tokenizer, mqar_example


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


def test_mqar_batches_are_deterministic_per_step_and_split():
  cfg = DataConfig(seq_len=64, batch_size=4, mqar_vocab_size=256, mqar_num_pairs=4)
  a, b = MQARBatches(cfg, seed=1).batch(5), MQARBatches(cfg, seed=1).batch(5)
  np.testing.assert_array_equal(a["inputs"], b["inputs"])
  assert not np.array_equal(a["inputs"], MQARBatches(cfg, seed=1).batch(6)["inputs"])
  assert not np.array_equal(a["inputs"], MQARBatches(cfg, seed=1, split="eval").batch(5)["inputs"])
  np.testing.assert_array_equal(a["inputs"][:, 1:], a["targets"][:, :-1])


def test_tokenizer_offline_from_rank_file(shared_data, monkeypatch):
  enc = load_gpt2_tokenizer(str(shared_data / "gpt2.tiktoken"))
  assert enc.encode("Hello world") == [15496, 995] and enc.n_vocab == 50257
  assert enc.encode("<|endoftext|>", allowed_special="all") == [50256]
  monkeypatch.setenv("LPCJAX_TIKTOKEN_FILE", str(shared_data / "gpt2.tiktoken"))
  assert load_gpt2_tokenizer().encode("Hello world") == [15496, 995]


def test_tokenizer_errors_are_clear(tmp_path):
  with pytest.raises(DataError, match="tokenizer rank file not found"):
    load_gpt2_tokenizer(str(tmp_path / "missing.tiktoken"))
  bad = tmp_path / "bad.tiktoken"
  bad.write_text("not a rank file\n")
  with pytest.raises(DataError, match="not a tiktoken rank file"):
    load_gpt2_tokenizer(str(bad))


def test_text_batches_round_trip(shared_data, tmp_path):
  text = "It was a dark and stormy night; the rain fell in torrents. " * 40
  path = tmp_path / "doc.txt.gz"
  with gzip.open(path, "wt", encoding="utf-8") as f:
    f.write(text)
  cfg = DataConfig(kind="text", seq_len=32, batch_size=2, train_files=(str(path),),
                   tokenizer_file=str(shared_data / "gpt2.tiktoken"))
  batches = TextBatches(cfg, seed=0, split="eval")
  enc = load_gpt2_tokenizer(cfg.tokenizer_file)
  assert batches.tokens[-1] == 50256 and enc.decode(batches.tokens[:-1].tolist()) == text
  batch = batches.batch(0)
  assert enc.decode(batch["inputs"][0].tolist()) in text
  np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])
  with pytest.raises(DataError, match="data file not found"):
    TextBatches(DataConfig(kind="text", train_files=(str(tmp_path / "nope.txt"),),
                           tokenizer_file=cfg.tokenizer_file), seed=0)
  with pytest.raises(DataError, match="fewer than seq_len"):
    TextBatches(DataConfig(kind="text", seq_len=100000, train_files=(str(path),),
                           tokenizer_file=cfg.tokenizer_file), seed=0)

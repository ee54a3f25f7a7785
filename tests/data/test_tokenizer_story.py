"""One tokenizer story for every command: --tokenizer-file on train.py, eval.py and generate,
the run records the rank file it was trained with, and offline errors name what works."""

import json
import os
import shutil

import pytest
import tiktoken

from conftest import TEXT, cli

from lpcjax.data import DataError, TextDataConfig, load_gpt2_tokenizer, prepare, with_tokenizer
from lpcjax.data.prepare import tokenizer_hash
from lpcjax.data.tokenizer import SHIPPED_RANK_FILE


@pytest.fixture
def offline(monkeypatch):
  """No download and no $LPCJAX_TIKTOKEN_FILE: what a command is given, a run recorded, or the
  rank file lpcjax ships (lpcjax never downloads one: a download here would fail the test)."""
  def no_download(name):
    raise ConnectionError(f"no network for {name}")
  monkeypatch.setattr(tiktoken, "get_encoding", no_download)
  monkeypatch.delenv("LPCJAX_TIKTOKEN_FILE", raising=False)


def tiny_text_run(tmp_path, *overrides):
  return ["model.vocab_size=50257", "data.seq_len=32", "data.batch_size=8", "model.d_model=32",
          "model.mlp_multiple_of=32", "train.steps=1", "train.warmup_steps=0", "train.eval_batches=1",
          f"train.run_dir={tmp_path}", *overrides]


def test_a_token_file_run_finds_its_tokenizer_offline(gpt2_rank_file, tmp_path, offline, capsys):
  rank_file = tmp_path / "copy.tiktoken"  # a copy, so the test can take it away again
  shutil.copy(gpt2_rank_file, rank_file)
  essay = str(TEXT)
  meta = prepare(str(tmp_path / "tokens"), [essay], tokenizer_file=str(rank_file), progress=False)
  assert meta["tokenizer_file"] == str(rank_file)  # the token file says where its tokenizer is
  from lpcjax.generate import main as generate
  train, evaluate = cli("train"), cli("eval")
  tokens = f"data.train_tokens={tmp_path / 'tokens'}"
  assert train(["--config", "fox_tiny_text", "data.kind=tokens", tokens,
                *tiny_text_run(tmp_path, "train.run_name=tokens")]) == 0
  run = tmp_path / "tokens"
  saved = json.load(open(run / "config.json"))["data"]
  assert saved["tokenizer_file"] == str(rank_file)  # recorded from the token file's metadata
  out = ["--out", str(tmp_path / "eval"), "--max-sequences", "1", "--eval-len", "32"]
  assert evaluate(["--run", str(run), *out]) == 0
  capsys.readouterr()
  assert generate(["--run", str(run), "--prompt", "He said", "--max-new-tokens", "2"]) == 0
  assert capsys.readouterr().out.startswith("He said")  # the prompt, echoed before its continuation
  assert generate(["--run", str(run), "--prompt", ""]) == 2  # an empty prompt, not an absent one
  assert capsys.readouterr().err.strip() == "error: generate: every prompt needs at least one token"

  os.remove(rank_file)  # the run moved to another machine: the recorded file is gone
  capsys.readouterr()
  assert generate(["--run", str(run), "--prompt", "He said", "--max-new-tokens", "2"]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and str(rank_file) in err and "--tokenizer-file" in err
  assert "data.tokenizer_file" not in err  # a field eval.py and generate cannot set
  given = gpt2_rank_file
  assert generate(["--run", str(run), "--prompt", "He said", "--max-new-tokens", "2",
                   "--tokenizer-file", given]) == 0
  assert evaluate(["--run", str(run), *out, "--tokenizer-file", given]) == 0


def test_train_takes_the_tokenizer_file_and_the_environment_variable(gpt2_rank_file, tmp_path,
                                                                      offline, monkeypatch, capsys):
  train = cli("train")
  essay = str(TEXT)
  rank_file = gpt2_rank_file
  args = ["--config", "fox_tiny_text", f"data.train_files={essay}", "--print-config"]
  capsys.readouterr()
  assert train([*args, "--tokenizer-file", rank_file]) == 0
  assert json.loads(capsys.readouterr().out)["data"]["tokenizer_file"] == os.path.abspath(rank_file)
  monkeypatch.setenv("LPCJAX_TIKTOKEN_FILE", os.path.relpath(rank_file))
  assert train(args) == 0  # the variable's file is recorded as an absolute path
  assert json.loads(capsys.readouterr().out)["data"]["tokenizer_file"] == os.path.abspath(rank_file)
  assert train(["--tokenizer-file", rank_file, "--print-config"]) == 2  # MQAR has no tokenizer
  assert capsys.readouterr().err.strip() == "error: --tokenizer-file: data.kind=mqar uses no tokenizer"
  monkeypatch.delenv("LPCJAX_TIKTOKEN_FILE")
  # offline with no setup: the rank file lpcjax ships, which the run records
  assert train(["--config", "fox_tiny_text", f"data.train_files={essay}",
                *tiny_text_run(tmp_path, "train.run_name=text")]) == 0
  assert json.load(open(tmp_path / "text" / "config.json"))["data"]["tokenizer_file"] == SHIPPED_RANK_FILE
  assert tokenizer_hash(load_gpt2_tokenizer()) == tokenizer_hash(load_gpt2_tokenizer(rank_file))  # the same ranks
  garbled = tmp_path / "garbled.tiktoken.gz"  # a gzip stream with its body overwritten
  packed = bytearray(open(SHIPPED_RANK_FILE, "rb").read()[:4000])
  packed[100:200] = bytes(100)
  garbled.write_bytes(bytes(packed))
  with pytest.raises(DataError, match=f"tokenizer rank file {garbled} is not a tiktoken rank file"):
    load_gpt2_tokenizer(str(garbled))
  # a path given now is never swapped for the shipped file, whatever its name; one that a run
  # recorded in another install of lpcjax reads this install's copy
  with pytest.raises(DataError, match="tokenizer rank file not found"):
    load_gpt2_tokenizer(str(tmp_path / "data" / "gpt2.tiktoken.gz"))
  elsewhere = TextDataConfig(train_files=(essay,), tokenizer_file="/another/venv/lpcjax/data/gpt2.tiktoken.gz")
  assert with_tokenizer(elsewhere, saved=True).tokenizer_file == SHIPPED_RANK_FILE
  assert with_tokenizer(elsewhere).tokenizer_file == elsewhere.tokenizer_file  # not recorded: as given
  missing = str(tmp_path / "gone.tiktoken")
  capsys.readouterr()
  assert train(["--config", "fox_tiny_text", f"data.train_files={essay}", "--tokenizer-file", missing,
                *tiny_text_run(tmp_path, "train.run_name=text2")]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and missing in err and "--tokenizer-file" in err and "LPCJAX_TIKTOKEN_FILE" in err

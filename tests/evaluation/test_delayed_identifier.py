"""The delayed-identifier probe: prompt layout, scoring against a direct computation, and eval.py
--delayed-id end to end on a tiny LPC-SM run trained with train.py (prompt lengths that are not
a multiple of its chunk size are right-padded)."""

import json

import jax
import numpy as np
import pytest

from lpcjax.data import load_gpt2_tokenizer
from lpcjax.data import tokenize_files
from lpcjax.runs import load_run
from lpcjax.evaluation.delayed_identifier import HEADER, delayed_identifier_probe, identifier_losses, probe_prompts

from conftest import TEXT, cli


@pytest.fixture
def tokenizer(gpt2_rank_file):
  return load_gpt2_tokenizer(gpt2_rank_file)


def _decode(tokenizer, tokens):
  return tokenizer.decode(list(map(int, tokens)))


def test_prompts_hold_header_distractor_trigger_and_identifier(tokenizer):
  distractor = np.arange(40000, 40900, dtype=np.int32)  # recognisable token ids
  pairs = probe_prompts(distractor, tokenizer, 300, count=4, seed=3)
  assert len(pairs) == 4
  for (cued, answer_start), (control, control_start) in pairs:
    assert len(cued) == len(control) == 300
    answer = _decode(tokenizer, cued[answer_start:])
    assert answer == _decode(tokenizer, control[control_start:])  # the same identifier is scored
    text = _decode(tokenizer, cued)
    assert text.startswith(HEADER.split("{")[0]) and f"Its identifier is{answer}." in text
    assert _decode(tokenizer, cued[:answer_start]).endswith(" is") and "The identifier of record" in text
    assert f"Its identifier is{answer}." not in _decode(tokenizer, control)  # the control names another
    first = int(np.argmax(cued >= 40000))
    assert first < 20 and np.all(np.diff(cued[first:first + 270]) == 1)  # one contiguous distractor slice
  with pytest.raises(ValueError, match="needs"):
    probe_prompts(distractor[:50], tokenizer, 300, count=1)


def test_identifier_losses_sum_the_answer_positions():
  examples = [(np.arange(10, dtype=np.int32), 7), (np.arange(10, 20, dtype=np.int32), 8)]
  table = np.random.default_rng(0).random((2, 9))
  losses = identifier_losses(lambda x, y: table, examples)
  # position t − 1 predicts token t: answer tokens 7..9 are scored at positions 6..8
  assert losses == [(pytest.approx(table[0, 6:].sum()), 3), (pytest.approx(table[1, 7:].sum()), 2)]


def test_probe_reduces_over_prompts(tokenizer):
  distractor = np.arange(1000, 1900, dtype=np.int32)
  probe = delayed_identifier_probe(lambda x, y: np.ones(y.shape), distractor, tokenizer, 200, count=3, seed=4)
  lengths = [len(tokens) - start for (tokens, start), _ in probe_prompts(distractor, tokenizer, 200, 3, seed=4)]
  for key in ("cued", "control"):  # a loss of 1 per position: the CE is the identifier's length
    assert probe[key]["per_prompt"] == lengths and probe[key]["key_ce_per_token"] == 1.0
    assert probe[key]["key_ce"] == pytest.approx(np.mean(lengths))


def test_eval_delayed_id_on_an_lpcsm_run(gpt2_rank_file, tmp_path, capsys):
  essay = str(TEXT)
  run_dir = tmp_path / "runs" / "lpcsm"
  overrides = [f"data.train_files={essay}", f"data.tokenizer_file={gpt2_rank_file}",
               "model.d_model=32", "model.num_layers=1", "model.num_heads=2", "model.mlp_multiple_of=32",
               "model.attention_window=16", "model.chunk_size=16", "model.memory_dim=8", "model.attention_impl=xla",
               "data.seq_len=64", "data.batch_size=8", "train.steps=2", "train.warmup_steps=1", "train.eval_batches=1",
               f"train.run_dir={tmp_path / 'runs'}", "train.run_name=lpcsm"]
  assert cli("train")(["--config", "lpcsm:tiny", *overrides]) == 0
  records = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
  assert {"lm_loss", "stop_loss", "prediction_loss", "sparse_ratio", "fire_rate"} <= set(records[0])

  out = ["--max-sequences", "1", "--eval-len", "64", "--out", str(tmp_path / "e")]
  assert cli("eval")(["--run", str(run_dir), *out]) == 0
  curve = (tmp_path / "e" / "per_token.json").read_text()
  capsys.readouterr()
  assert cli("eval")(["--run", str(run_dir), "--delayed-id", "--delayed-id-len", "150", "--delayed-id-prompts", "2",
                      "--haystack", essay, *out]) == 0
  printed = capsys.readouterr().out
  assert "delayed identifier (2 prompts of 150 tokens): key CE" in printed
  assert "probes only" in printed
  assert (tmp_path / "e" / "per_token.json").read_text() == curve  # the probe ran alone
  probe = json.load(open(tmp_path / "e" / "probes.json"))["delayed_identifier"]
  assert probe["prompt_len"] == 150 and len(probe["cued"]["per_prompt"]) == 2  # 150: padded to 160

  # the probe's summed CE equals a direct computation on the unpadded prompt
  run = load_run(str(run_dir))
  tokenizer = load_gpt2_tokenizer(gpt2_rank_file)
  (tokens, start), _ = probe_prompts(tokenize_files([essay], tokenizer)[0], tokenizer, 150, 2, seed=0)[0]
  padded = np.pad(tokens[:-1], (0, 160 - 149))[None]
  logits = run.model.apply({"params": run.params}, padded)[0, :149]
  ce = -jax.nn.log_softmax(logits)[np.arange(149), tokens[1:]]
  np.testing.assert_allclose(probe["cued"]["per_prompt"][0], float(ce[start - 1:].sum()), rtol=1e-4)

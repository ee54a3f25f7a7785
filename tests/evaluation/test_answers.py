"""Accuracy at the answers of the generated tasks (eval.py --split test), the SITH model on them,
and the mechanism suite's configs."""

import jax
import numpy as np
import pytest

from lpcjax import experiment as C
from lpcjax.data import DataError, DelayedIdConfig, make_dataset
from lpcjax.evaluation import LanguageModelEvaluator, answer_accuracy
from lpcjax.runs import evaluate_run
from lpcjax.training import train

from conftest import REPO, tiny_experiment


def test_answer_accuracy_by_the_batches_buckets():
  targets = np.array([[5, 6, 7, 8], [5, 6, 7, 8]])
  batch = {"inputs": np.zeros((2, 4), np.int32), "targets": targets,
           "loss_mask": np.array([[0, 1, 1, 1], [1, 1, 1, 1]], np.float32),
           "answer_bucket": np.array([[-1, 1, 2, 2], [4, 4, 4, 4]]), "valid": np.array([1.0, 0.0])}
  predictions = np.array([[0, 6, 0, 8], [5, 6, 7, 8]])  # row 1 is padding: never counted
  result = answer_accuracy(lambda tokens: predictions, [batch])
  assert result == {"accuracy": 2 / 3, "count": 3,
                    "by_bucket": {"1": {"accuracy": 1.0, "count": 1}, "2": {"accuracy": 0.5, "count": 2}}}


@pytest.fixture(scope="module")
def delayed_id_run(tmp_path_factory):
  root = tmp_path_factory.mktemp("runs")
  cfg = tiny_experiment(root, "data.kind=delayed_id", "data.task_vocab_size=64", "model.vocab_size=64",
                        "data.delayed_id_max_ids=3", "data.delayed_id_gap=8", "train.steps=3", "train.warmup_steps=1",
                        "train.mesh_data=1", name="delayed_id")
  run, _ = train(cfg, progress=False, devices=jax.devices()[:1])
  return run, cfg


def test_test_split_is_scored_at_the_answers_by_bucket(delayed_id_run, tmp_path):
  run, cfg = delayed_id_run
  result = evaluate_run(run, split="test", eval_len=32, max_sequences=16, progress=False)
  answers = result["answers"]
  test = make_dataset(cfg.data.for_evaluation(32, 8), 0, "test", max_examples=16)
  expected = sum(float(test[i]["loss_mask"].sum()) for i in range(len(test)))
  assert answers["count"] == expected and answers["split"] == "test" and answers["eval_len"] == 32
  assert answers["chance"] == 1 / 32 and answers["bucket_name"] == "identifiers"
  assert set(answers["by_bucket"]) <= {"1", "2", "3"}
  assert sum(cell["count"] for cell in answers["by_bucket"].values()) == expected
  held_out = evaluate_run(run, eval_len=32, max_sequences=16, progress=False)["answers"]
  assert held_out["split"] == "eval"
  evaluator = LanguageModelEvaluator()
  evaluator.write([result], str(tmp_path), type("Options", (), {"window": 8, "log_x": False})())
  assert (tmp_path / "accuracy_by_bucket.png").stat().st_size > 1000
  assert "accuracy at the answers (test split)" in "\n".join(evaluator.report(result))


def test_test_split_of_text_data_is_a_one_line_error(delayed_id_run, tmp_path):
  run, _ = delayed_id_run
  (tmp_path / "a.txt").write_text("some text")
  with pytest.raises(DataError, match="--split test: only generated data kinds"):
    evaluate_run(run, split="test", data=[str(tmp_path / "a.txt")], progress=False)


def test_sith_reads_the_last_window_of_a_longer_sequence():
  from lpcjax import models
  cfg = models.SITHConfig(vocab_size=64, d_model=32, num_layers=1, num_heads=2, mlp_dim=64, num_filters=9, chunk_len=8)
  model = models.get("sith").build(cfg)
  window = cfg.window_len
  tokens = np.random.default_rng(0).integers(0, 64, (2, window + 8))
  params = model.init(jax.random.PRNGKey(0), tokens[:, -window:])["params"]
  apply = lambda x: model.apply({"params": params}, x)
  np.testing.assert_allclose(apply(tokens), apply(tokens[:, -window:]), atol=1e-6)
  with pytest.raises(ValueError, match="expected windows"):
    model.apply({"params": params}, tokens[:, :window - 1])


def test_sith_checks_generated_lengths_and_keeps_text_windows_exact():
  base = C.load_experiment("mechanisms:delayed_id-sith", str(REPO / "configs"))  # H + m = 91 + 32
  assert C.apply_overrides(base, ["data.seq_len=160"]).data.seq_len == 160
  with pytest.raises(C.ConfigError, match="needs seq_len >= 123, got 112"):
    C.apply_overrides(base, ["data.seq_len=112"])
  text = ["data.kind=tokens", "data.train_tokens=x", "model.vocab_size=50257"]
  with pytest.raises(C.ConfigError, match="reads windows of 123 tokens"):
    C.apply_overrides(base, [*text, "data.seq_len=128"])
  assert C.apply_overrides(base, [*text, "data.seq_len=123"]).data.seq_len == 123


def test_every_mechanism_cell_builds_and_bad_names_are_one_line():
  import importlib.util
  spec = importlib.util.spec_from_file_location("mechanisms_config", REPO / "configs" / "mechanisms.py")
  suite = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(suite)
  for task in suite.TASKS:
    for model in suite.MODELS:
      if model.startswith("sith") and task not in suite.END_ANSWER_TASKS:
        continue
      cfg = C.load_experiment(f"mechanisms:{task}-{model}", str(REPO / "configs"))
      assert cfg.data.seq_len == 128 and cfg.model.vocab_size >= cfg.data.vocab_size
  assert isinstance(C.load_experiment("mechanisms:delayed_id", str(REPO / "configs")).data, DelayedIdConfig)
  for spec, message in (("mqar-mamba", "MODEL one of"), ("copying", "TASK one of"),
                        ("mqar-sith", "a SITH model predicts only")):
    with pytest.raises(C.ConfigError, match=message):
      C.load_experiment(f"mechanisms:{spec}", str(REPO / "configs"))

"""A family defined only in the tests (tests/toy_family.py: float series, BatchNorm, dropout, a
classification loss, its own evaluator) trains, resumes bitwise, evaluates and plots through
train.py and eval.py, with no edit to the harness."""

import json
import os

import jax
import numpy as np
import pytest

import toy_family
from conftest import REPO, cli, sigterm_after_rows
from lpcjax import experiment as C
from lpcjax.evaluation.runner import load_run


@pytest.fixture
def experiment_file(tmp_path):
  path = tmp_path / "toy_experiment.py"
  path.write_text(f"import sys\nsys.path.insert(0, {str(REPO / 'tests')!r})\nimport toy_family\n\n"
                  f"def get_config():\n  return toy_family.experiment({str(tmp_path / 'runs')!r})\n")
  return str(path)


def records(run_dir):
  return [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]


def state_leaves(run_dir):
  run = load_run(run_dir)
  return jax.tree.leaves((run.params, run.mutable)), run


def test_toy_family_trains_resumes_bitwise_and_evaluates(experiment_file, tmp_path):
  train, evaluate = cli("train"), cli("eval")
  runs = tmp_path / "runs"
  assert train(["--config", experiment_file, "train.run_name=straight"]) == 0
  # Preempted (SIGTERM) after 3 steps, then resumed: flags and overrides in any order.
  with pytest.MonkeyPatch.context() as patch:
    sigterm_after_rows(patch, rows=3)
    # stopped short of train.steps: not a success
    assert train(["--config", experiment_file, "train.run_name=split"]) == 130
  summary = json.load(open(runs / "split" / "summary.json"))
  assert summary["preempted"] and summary["step"] == 3
  assert train(["--config", experiment_file, "train.run_name=split", "--resume", "train.log_every=1"]) == 0

  straight, split = records(runs / "straight"), records(runs / "split")
  losses = lambda rs: [(r["step"], r["loss"]) for r in rs if "loss" in r]
  assert losses(split) == losses(straight) and len(losses(straight)) == 8  # bitwise, dropout included
  assert all("samples_per_sec" in r and "accuracy" in r for r in straight if "loss" in r)
  (straight_leaves, run), (split_leaves, _) = state_leaves(runs / "straight"), state_leaves(runs / "split")
  for a, b in zip(straight_leaves, split_leaves):
    np.testing.assert_array_equal(a, b)
  stats = run.mutable["batch_stats"]["BatchNorm_0"]
  assert float(np.abs(stats["mean"]).max()) > 0 and not np.allclose(stats["var"], 1.0)  # trained, saved

  summary = json.load(open(runs / "straight" / "summary.json"))
  assert summary["eval_examples"] == 20  # 3 batches of 8, the last one padded: none dropped, none doubled
  out = tmp_path / "eval"
  assert evaluate(["--run", str(runs / "straight"), "--out", str(out)]) == 0
  (result,) = json.load(open(out / "toy.json"))
  assert result["examples"] == 20 and (out / "accuracy.png").stat().st_size > 1000
  assert result["accuracy"] == pytest.approx(summary["eval_accuracy"], abs=1e-12)


def test_toy_family_config_errors_name_the_field(tmp_path):
  cfg = toy_family.experiment(tmp_path)
  with pytest.raises(C.ConfigError, match="data.kind: the toy_classifier family reads toy_series, not 'mqar'"):
    C.apply_overrides(cfg, ["data.kind=mqar"])
  with pytest.raises(C.ConfigError, match="data.kind: the fox family reads mqar or text or tokens, not 'toy_series'"):
    C.apply_overrides(cfg, ["model.family=fox"])
  assert C.from_dict(json.loads(C.to_json(cfg))) == cfg

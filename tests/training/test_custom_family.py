"""A family defined only in the tests (tests/toy_family.py: float series, BatchNorm, dropout, a
classification loss, its own evaluator) trains, resumes bitwise, evaluates and plots through
train.py and eval.py, with no edit to the harness."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import toy_family
from conftest import REPO, cli, sigterm_after_rows
from lpcjax import experiment as C
from lpcjax.runs import load_run


def write_experiment(tmp_path, function="experiment"):
  path = tmp_path / f"toy_{function}.py"
  path.write_text(f"import sys\nsys.path.insert(0, {str(REPO / 'tests')!r})\nimport toy_family\n\n"
                  f"def get_config():\n  return toy_family.{function}({str(tmp_path / 'runs')!r})\n")
  return str(path)


@pytest.fixture
def experiment_file(tmp_path):
  return write_experiment(tmp_path)


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
  with pytest.raises(C.ConfigError, match="data.kind: the fox family reads mqar or .* not 'toy_series'"):
    C.apply_overrides(cfg, ["model.family=fox"])
  assert C.from_dict(json.loads(C.to_json(cfg))) == cfg


def test_a_fresh_process_evaluates_and_generates_a_family_defined_outside_the_package(experiment_file, tmp_path):
  """The run records the module that registered its family (config.json's ``defined_in``), so
  eval.py and generate, started afresh where that module is not importable by name, import it
  from its file before looking the family up."""
  train, runs = cli("train"), tmp_path / "runs"
  assert train(["--config", experiment_file, "train.run_name=toy", "train.steps=2"]) == 0
  assert train(["--config", write_experiment(tmp_path, "lm_experiment"), "train.run_name=lm"]) == 0
  recorded = json.load(open(runs / "toy" / "config.json"))["defined_in"]["model.family"]
  assert recorded == {"module": "toy_family", "file": str(REPO / "tests" / "toy_family.py")}
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  run = lambda *args: subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True)
  evaluated = run(str(REPO / "eval.py"), "--run", str(runs / "toy"), "--out", str(tmp_path / "eval"))
  assert evaluated.returncode == 0, evaluated.stderr
  assert json.load(open(tmp_path / "eval" / "toy.json"))[0]["examples"] == 20
  generated = run("-m", "lpcjax.generate", "--run", str(runs / "lm"), "--token-ids", "5,17,3", "--max-new-tokens", "3")
  assert generated.returncode == 0, generated.stderr
  printed = generated.stdout.split()
  assert printed[:3] == ["5", "17", "3"] and len(printed) == 6  # the prompt, echoed, and three new ids


def test_an_experiment_files_hooks_see_the_steps_state_and_metrics(tmp_path):
  """``get_hooks(config)`` in the experiment file: train.py runs each ``Hook`` on its cadence
  (every 3 steps, the last step, and before the first with ``at_start``), with the step's
  state and metrics; a non-Hook is one line."""
  seen = tmp_path / "seen.jsonl"
  path = tmp_path / "hooked.py"
  path.write_text(f"""import json, sys
sys.path.insert(0, {str(REPO / 'tests')!r})
import jax
import toy_family
from lpcjax.training import Hook

def get_config():
  return toy_family.experiment({str(tmp_path / 'runs')!r})

def record(step, state, metrics):
  loss = None if metrics is None else float(metrics["loss"][0] / metrics["loss"][1])
  with open({str(seen)!r}, "a") as f:
    f.write(json.dumps({{"step": step, "state_step": int(state.step), "loss": loss,
                        "leaves": len(jax.tree.leaves(state.params))}}) + "\\n")

def get_hooks(config):
  return [Hook(every=3, action=record, at_start=True)]
""")
  assert cli("train")(["--config", str(path), "train.run_name=hooked"]) == 0
  rows = [json.loads(line) for line in open(seen)]
  assert [(r["step"], r["state_step"]) for r in rows] == [(0, 0), (3, 3), (6, 6), (8, 8)]
  assert rows[0]["loss"] is None and all(r["loss"] > 0 for r in rows[1:]) and rows[0]["leaves"] > 0
  logged = {r["step"]: r["loss"] for r in records(tmp_path / "runs" / "hooked") if "loss" in r}
  assert rows[1]["loss"] == pytest.approx(logged[3], rel=1e-6)

  path.write_text(path.read_text().replace("return [Hook(", "return [print, Hook("))
  with pytest.raises(C.ConfigError, match="hooks: each must be an lpcjax.training.Hook, got builtin_function"):
    from lpcjax.training import train
    train(C.load_experiment(str(path)), hooks=C.experiment_hooks(str(path), None))

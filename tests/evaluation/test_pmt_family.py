"""PMT end to end through the commands users run: train.py pre-trains on a .npz file (with
missing values), eval.py writes the linear-probe and cue-retention results, the controls and the
plots, for the checkpoint and for a random init (in its own folder); a gap that does not fit is
a one-line warning; a series too short for a patch is a one-line error."""

import json
import shutil

import numpy as np
import pytest

from conftest import cli

TINY = ["model.d_model=16", "model.num_heads=2", "model.num_blocks=1", "model.tokenizer_kernels=8",
        "model.projection_dim=16", "model.patch_size=4", "model.patch_stride=2", "model.neighbourhood=4",
        "data.batch_size=8", "train.steps=3", "train.log_every=1", "train.warmup_steps=1"]


def write_npz(path, count, seed):
  """Two classes of noisy sines (frequency 1 or 3) on two channels; a few missing samples."""
  rng = np.random.default_rng(seed)
  y = np.arange(count) % 2
  t = np.linspace(0, 1, 48)
  x = np.sin(2 * np.pi * (1 + 2 * y[:, None, None]) * t[None, :, None] + rng.uniform(0, 6, (count, 1, 2)))
  x = (x + 0.1 * rng.normal(size=x.shape)).astype(np.float32)
  x[0, 30:] = np.nan
  np.savez(path, x=x, y=y)
  return str(path)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
  """One pre-training for the whole file (its compilation is most of a test's time)."""
  tmp_path = tmp_path_factory.mktemp("pmt")
  train_file, eval_file = write_npz(tmp_path / "train.npz", 20, 0), write_npz(tmp_path / "test.npz", 12, 1)
  overrides = TINY + [f"data.train_file={train_file}", f"data.eval_file={eval_file}",
                      f"train.run_dir={tmp_path / 'runs'}", "train.run_name=pmt"]
  assert cli("train")(["--config", "pmt:tiny", *overrides]) == 0
  return tmp_path


def test_pretrain_then_probe(pretrained, tmp_path, capsys):
  records = [json.loads(line) for line in open(pretrained / "runs" / "pmt" / "metrics.jsonl")]
  trained = [r for r in records if "loss" in r]
  assert len(trained) == 3 and all(np.isfinite(r["loss"]) and {"icl", "hgcl", "pcl", "series_per_sec"} <= set(r)
                                   for r in trained)
  assert records[-1]["eval_examples"] == 12

  evaluate = cli("eval")
  options = ["--seeds", "2", "--gaps", "0,2,50", "--fractions", "0.25,1.0"]  # 50 windows: does not fit
  out = tmp_path / "probes"
  capsys.readouterr()
  assert evaluate(["--run", str(pretrained / "runs" / "pmt"), "--out", str(out), *options]) == 0
  (result,) = json.load(open(out / "series_probes.json"))
  assert set(result["linear"]["fractions"]) == {"0.25", "1.0"}
  assert result["linear"]["fractions"]["0.25"]["labels"] == 4  # round(25 % of 10) = 2 per class
  assert set(result["cue"]) == {"0.0", "2.0"} and all(0 <= c["auc"] <= 1 for c in result["cue"].values())
  # Series 0 of each split has 30 valid samples: a cue 2 whole windows before its last window does not fit it.
  assert result["cue"]["0.0"]["series"] == 32 and result["cue"]["2.0"]["series"] == 30
  assert set(result["controls"]) == {"raw series, same probe", "raw series, 1-NN", "pmt_tiny (random init)"}
  assert set(result["controls"]["pmt_tiny (random init)"]) == {"linear", "cue"}
  assert set(result["gates"]) == {"block_0"} and 0 < result["gates"]["block_0"]["skip"] < 1
  assert result["num_params"] > 0
  assert (out / "probe_accuracy.png").stat().st_size > 0 and (out / "cue_auc.png").stat().st_size > 0
  captured = capsys.readouterr()
  assert "probe, 25% labels" in captured.out and "raw series, 1-NN" in captured.out
  warnings = [line for line in captured.err.splitlines() if line.startswith("warning:")]
  assert len(warnings) == 2  # once per gap, not once per encoder
  assert any("gap 50" in line and "skipped" in line for line in warnings)
  assert any("gap 2" in line and "2 short series" in line for line in warnings)

  run = pretrained / "runs" / "pmt"
  assert evaluate(["--run", str(run), "--random-init", "--probes", "linear", "--controls", "none", *options]) == 0
  (random,) = json.load(open(run / "eval_random_init" / "series_probes.json"))
  assert random["step"] == 0 and "random init" in random["label"] and "cue" not in random
  assert "controls" not in random and not (run / "eval").exists()  # beside the trained results, not over them


def test_series_shorter_than_a_patch_is_a_one_line_error(tmp_path, capsys):
  train_file = write_npz(tmp_path / "train.npz", 8, 0)
  code = cli("train")(["--config", "pmt:tiny", *TINY, f"data.train_file={train_file}", "model.patch_size=64",
                       f"train.run_dir={tmp_path / 'runs'}"])
  err = capsys.readouterr().err.strip()
  assert code != 0 and "shorter than one patch" in err and len(err.splitlines()) == 1
  assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_probe_of_a_one_class_file_is_a_one_line_error(pretrained, tmp_path, capsys):
  """Pre-training ignores labels, so the one-class run is the pre-trained one pointed at a
  one-class file (the same series): no second pre-training."""
  path = tmp_path / "one_class.npz"
  arrays = dict(np.load(pretrained / "train.npz"))
  np.savez(path, x=arrays["x"], y=np.zeros(len(arrays["y"]), int))
  run = tmp_path / "one"
  shutil.copytree(pretrained / "runs" / "pmt", run)
  config = json.load(open(run / "config.json"))
  config["data"].update(train_file=str(path), eval_file=None)  # evaluated on its training file
  json.dump(config, open(run / "config.json", "w"))
  capsys.readouterr()
  assert cli("eval")(["--run", str(run), "--probes", "linear"]) == 2
  err = capsys.readouterr().err.strip()
  assert "have one class" in err and len(err.splitlines()) == 1

import warnings

import numpy as np
import pytest

from lpcjax.data.subsets import stratified_subset
from lpcjax.evaluation.series_probes import (cue_dataset, cue_probe, cue_span, insert_cue, linear_probe,
                                             plot_cue_auc, plot_probe_accuracy)


def clusters(n, classes=3, dim=3, spread=0.3, seed=0):
  """Separable features: class k sits at 5 * e_k plus small noise (no pure-noise dimensions:
  standardizing on one example per class would blow those up)."""
  rng = np.random.default_rng(seed)
  labels = np.arange(n) % classes
  features = rng.normal(0, spread, (n, dim))
  features[np.arange(n), labels] += 5.0
  return features, labels


@pytest.mark.parametrize("classifier", ["svm", "logistic", "ridge"])
def test_linear_probe_separable(classifier):
  train_x, train_y = clusters(300)
  test_x, test_y = clusters(150, seed=1)
  out = linear_probe(train_x, train_y, test_x, test_y, seeds=(0, 1, 2), classifier=classifier)
  assert out["classifier"] == classifier
  assert set(out["fractions"]) == {"0.01", "0.05", "1.0"}
  full = out["fractions"]["1.0"]
  assert full["accuracy"] == 1.0 and full["macro_f1"] == 1.0 and full["accuracy_std"] == 0.0
  assert full["labels"] == 300 and [r["seed"] for r in full["per_seed"]] == [0, 1, 2]
  for fraction in (0.01, 0.05):
    cell = out["fractions"][str(fraction)]
    sizes = [len(stratified_subset(train_y, fraction, seed)) for seed in (0, 1, 2)]
    assert [r["labels"] for r in cell["per_seed"]] == sizes
    assert cell["labels"] == np.mean(sizes)
    assert cell["accuracy"] > 0.9  # even one example per class separates these clusters
    accuracies = [r["accuracy"] for r in cell["per_seed"]]
    assert cell["accuracy"] == pytest.approx(np.mean(accuracies))
    assert cell["accuracy_std"] == pytest.approx(np.std(accuracies))


def test_linear_probe_noise_is_near_chance():
  rng = np.random.default_rng(0)
  train_x, test_x = rng.normal(size=(400, 16)), rng.normal(size=(2000, 16))
  train_y, test_y = rng.integers(0, 4, 400), rng.integers(0, 4, 2000)
  out = linear_probe(train_x, train_y, test_x, test_y, fractions=(0.05, 1.0), seeds=(0, 1))
  for cell in out["fractions"].values():
    assert abs(cell["accuracy"] - 0.25) < 0.06


def test_linear_probe_fits_the_full_set_once(monkeypatch):
  from lpcjax.evaluation import series_probes
  calls = []
  real = series_probes._fit_predict
  monkeypatch.setattr(series_probes, "_fit_predict", lambda *a: calls.append(1) or real(*a))
  train_x, train_y = clusters(60)
  linear_probe(train_x, train_y, train_x, train_y, fractions=(1.0,), seeds=(0, 1, 2, 3, 4))
  assert len(calls) == 1


def test_linear_probe_errors():
  x, y = clusters(30)
  with pytest.raises(ValueError, match="one class"):
    linear_probe(x, np.zeros(30, int), x, y)
  bad = x.copy()
  bad[3, 2] = np.nan
  with pytest.raises(ValueError, match="NaN or inf"):
    linear_probe(bad, y, x, y)
  bad[3, 2] = np.inf
  with pytest.raises(ValueError, match="test.*NaN or inf"):
    linear_probe(x, y, bad, y)
  with pytest.raises(ValueError, match="classifier"):
    linear_probe(x, y, x, y, classifier="knn")


def expected_cue(series, gap_ratio, amplitude, width):
  """The cue computed directly from the definition, for one series [T]."""
  length = len(series)
  size = max(3, round(width * length))
  end = length - round(gap_ratio * length)
  start = end - size
  outside = np.concatenate([series[:start], series[end:]])
  cue = np.zeros(length)
  cue[start:end] = amplitude * np.nanstd(outside) * np.hanning(size)
  return cue, start, end


@pytest.mark.parametrize("gap_ratio", [0.0, 0.25, 0.8])
def test_insert_cue_matches_definition(gap_ratio):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(4, 50, 3)) * np.array([1.0, 3.0, 0.5])
  x[1, 5, 1] = np.nan  # missing samples, inside and outside the cue span
  x[2, 0:3, 1] = np.nan
  end = 50 - round(gap_ratio * 50)
  x[3, end - 2, 1] = np.nan
  before = x.copy()
  out = insert_cue(x, gap_ratio, amplitude=0.7, channel=1)
  np.testing.assert_array_equal(x, before)  # not mutated
  np.testing.assert_array_equal(np.isnan(out), np.isnan(x))
  np.testing.assert_array_equal(out[:, :, [0, 2]], x[:, :, [0, 2]])
  for n in range(4):
    cue, start, stop = expected_cue(x[n, :, 1], gap_ratio, 0.7, 0.2)
    assert (start, stop) == cue_span(50, gap_ratio) == (end - 10, end)
    np.testing.assert_allclose(out[n, :, 1], x[n, :, 1] + cue, equal_nan=True)
    # sigma excludes the span: with the span's samples counted it would differ
    assert not np.isclose(np.nanstd(x[n, start:stop, 1]), np.nanstd(x[n, :, 1]))


def test_insert_cue_short_series_and_range():
  x = np.arange(10.0).reshape(1, 10, 1)
  out = insert_cue(x, 0.0, width=0.1)  # round(1) < 3: the cue still spans 3 samples
  changed = np.flatnonzero(out[0, :, 0] != x[0, :, 0])
  np.testing.assert_array_equal(changed, [8])  # a 3-point Hann is zero at both ends
  with pytest.raises(ValueError, match="gap_ratio=0.9, width=0.2"):
    insert_cue(np.zeros((2, 50, 1)), 0.9)
  with pytest.raises(ValueError, match="gap_ratio=-0.1"):
    insert_cue(np.zeros((2, 50, 1)), -0.1)
  insert_cue(np.zeros((2, 50, 1)), 0.8)  # the cue fits exactly: [0, 10)


def test_cue_dataset_marks_half_seeded():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(11, 40, 2))
  out, has_cue = cue_dataset(x, 0.25, seed=3, amplitude=1.0)
  assert has_cue.dtype.kind == "i" and has_cue.sum() == 5 and set(has_cue) == {0, 1}
  np.testing.assert_array_equal(out[has_cue == 0], x[has_cue == 0])
  np.testing.assert_allclose(out[has_cue == 1], insert_cue(x[has_cue == 1], 0.25, amplitude=1.0))
  again, same = cue_dataset(x, 0.25, seed=3, amplitude=1.0)
  np.testing.assert_array_equal(same, has_cue)
  np.testing.assert_array_equal(again, out)
  other = [cue_dataset(x, 0.25, seed=s)[1] for s in range(1, 6)]
  assert any((o != has_cue).any() for o in other)


def test_cue_probe():
  rng = np.random.default_rng(0)
  train_y, test_y = rng.permutation(np.arange(200) % 2), rng.permutation(np.arange(200) % 2)
  train_x, test_x = rng.normal(size=(200, 5)), rng.normal(size=(200, 5))
  noise = cue_probe(train_x, train_y, test_x, test_y)
  assert abs(noise["auc"] - 0.5) < 0.12 and abs(noise["top1"] - 0.5) < 0.12
  train_x[:, 2] = train_y + rng.normal(0, 0.05, 200)
  test_x[:, 2] = test_y + rng.normal(0, 0.05, 200)
  clean = cue_probe(train_x, train_y, test_x, test_y)
  assert clean == {"auc": 1.0, "top1": 1.0, "macro_f1": 1.0}
  with pytest.raises(ValueError, match="with and without"):
    cue_probe(train_x, np.zeros(200), test_x, test_y)
  train_x[0, 0] = np.nan
  with pytest.raises(ValueError, match="NaN"):
    cue_probe(train_x, train_y, test_x, test_y)


def is_png(path):
  with open(path, "rb") as f:
    return f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_plots(tmp_path):
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # no matplotlib warnings (empty legend, NaN limits)
    path = tmp_path / "cue.png"
    curves = {"PMT": {0.0: (0.95, 0.02), 0.25: (0.8, 0.05)}, "xLSTM": {0.0: (0.7, 0.1), 0.25: (0.55, 0.03)}}
    assert plot_cue_auc(curves, path) == path and is_png(path) and path.stat().st_size > 1000
    assert plot_cue_auc({}, path) is None and not path.exists()  # a stale plot goes too
    assert plot_cue_auc({"PMT": {0.0: (np.nan, np.nan)}}, tmp_path / "nan.png") is None
    assert not (tmp_path / "nan.png").exists()

    x, y = clusters(60)
    result = linear_probe(x, y, x, y, fractions=(0.05, 1.0), seeds=(0, 1))
    path = tmp_path / "probe.png"
    assert plot_probe_accuracy({"PMT": result, "TS2Vec": result}, path) == path
    assert is_png(path) and path.stat().st_size > 1000
    assert plot_probe_accuracy({}, tmp_path / "none.png") is None
    assert plot_probe_accuracy({"PMT": {"classifier": "svm", "fractions": {}}}, tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def test_cue_placement_paper_counts_whole_windows_within_each_valid_length():
  from lpcjax.evaluation.series import cue_placement
  from lpcjax.models import PMTConfig
  # 48 samples, patch 4 / stride 2: K = 23 tokens, W = 4, S = 2 (overlapping) or 4 (not).
  x = np.zeros((2, 48, 1), np.float32)
  x[1, 30:] = np.nan  # 30 valid samples: 14 tokens
  overlapping = PMTConfig(patch_size=4, patch_stride=2)
  spans, last = cue_placement(overlapping, x, 1, "paper")
  # series 0: last full window 9 starts at token 18 = sample 36; one whole window (4 tokens,
  # 8 samples) before: the cue ends at 28 and spans 20 % of 48 = 10 samples.
  assert last.tolist() == [9, 5] and spans[0].tolist() == [18, 28]
  assert spans[1].tolist() == [6 * 2 - 6, 12] and spans[1, 1] == (5 * 2 - 4) * 2  # width 20 % of 30 = 6
  spans, last = cue_placement(overlapping, x, 1, "overlap")  # the earlier variant: strides, padded length
  assert last.tolist() == [9, 9] and spans.tolist() == [[22, 32], [22, 32]]  # (9 - 1) strides of 4 samples
  spans, last = cue_placement(PMTConfig(patch_size=4, patch_stride=2, window_stride_fraction=1.0), x, 1, "paper")
  assert last.tolist() == [4, 2] and spans[0].tolist() == [14, 24]
  _, last = cue_placement(overlapping, x, 3, "paper")
  assert last.tolist() == [9, -1]  # does not fit the short series


def test_insert_cue_at_per_series_spans():
  x = np.random.default_rng(0).normal(size=(2, 30, 1))
  out = insert_cue(x, np.array([[0, 10], [5, 20]]), amplitude=1.0)
  changed = np.abs(out - x)[..., 0] > 1e-9
  assert changed[0, 1:9].all() and not changed[0, 10:].any()
  assert changed[1, 6:19].all() and not changed[1, :5].any() and not changed[1, 20:].any()
  with pytest.raises(ValueError, match="spans"):
    insert_cue(x, np.array([[0, 40], [0, 10]]))


def test_label_fractions_that_draw_the_same_subsets_are_one_row(capsys):
  rng = np.random.default_rng(0)
  y = np.repeat([0, 1], 20)
  x = rng.normal(size=(40, 3)) + y[:, None]
  out = linear_probe(x, y, x, y, fractions=(0.01, 0.05, 0.5), seeds=(0, 1))
  cells = out["fractions"]
  assert cells["0.05"]["same_as"] == "0.01" and "same_as" not in cells["0.5"] and "same_as" not in cells["0.01"]
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("warning:") and "one row" in err[0]
  largest_first = linear_probe(x, y, x, y, fractions=(0.5, 0.05, 0.01), seeds=(0, 1))["fractions"]
  assert largest_first["0.05"]["same_as"] == "0.01" and "same_as" not in largest_first["0.01"]


def test_one_nearest_neighbour_control():
  x = np.array([[0.0, 0.0], [10.0, 10.0]])
  out = linear_probe(x, [0, 1], x + 0.1, [0, 1], fractions=(1.0,), seeds=(0,), classifier="1nn")
  assert out["fractions"]["1.0"]["accuracy"] == 1.0


def test_compared_runs_of_one_config_keep_their_rows():
  from lpcjax.evaluation.series import plot_rows
  result = lambda run: {"run": run, "label": "pmt_tiny", "linear": {"fractions": {}},
                        "controls": {"raw series, 1-NN": {"linear": {"fractions": {}}}}}
  rows = plot_rows([result("runs/a"), result("runs/b/")])
  assert set(rows) == {"pmt_tiny", "raw series, 1-NN", "pmt_tiny [b]", "raw series, 1-NN [b]"}


def test_a_series_with_no_observed_sample_gets_no_cue():
  from lpcjax.evaluation.series import cue_placement, valid_lengths
  from lpcjax.models import PMTConfig
  x = np.zeros((3, 48, 1), np.float32)
  x[1, 30:] = np.nan
  x[2] = np.nan  # nothing observed
  assert valid_lengths(x).tolist() == [48, 30, 0]
  _, last = cue_placement(PMTConfig(patch_size=4, patch_stride=2), x, 0, "paper")
  assert last[2] == -1 and last[0] >= 0

import gzip

import numpy as np
import pytest

from lpcjax.config import ConfigError
from lpcjax.data import (DataError, SeriesDataConfig, SeriesSource, make_dataset, make_iterator, read_series,
                         stratified_subset)

from conftest import UCR


def write_tsv(path, rows):
  """rows: (label, [values...]) with None for an empty (missing) field."""
  text = "".join(f"{label}\t" + "\t".join("" if v is None else str(v) for v in values) + "\n"
                 for label, values in rows)
  opener = gzip.open if str(path).endswith(".gz") else open
  with opener(path, "wt") as f:
    f.write(text)
  return str(path)


def labelled_tsv(path, labels, length=6, offset=0.0, seed=0):
  rng = np.random.default_rng(seed)
  return write_tsv(path, [(label, list(offset + rng.normal(size=length).round(4))) for label in labels])


@pytest.mark.parametrize("name", ["a.tsv", "a.tsv.gz"])
def test_tsv_reads_labels_values_missing_and_ragged_rows(tmp_path, name):
  path = write_tsv(tmp_path / name, [(1, [0.5, "NaN", 2.0]), (-1, [1.0, None, "nan", 4.0, 5.0]), (1, [3.0])])
  x, labels = read_series(path)
  assert x.dtype == np.float32 and x.shape == (3, 5, 1)
  np.testing.assert_array_equal(labels, [1, -1, 1])
  np.testing.assert_array_equal(x[0, :, 0], [0.5, np.nan, 2.0, np.nan, np.nan])  # padded at the end
  np.testing.assert_array_equal(x[1, :, 0], [1.0, np.nan, np.nan, 4.0, 5.0])
  np.testing.assert_array_equal(x[2, :, 0], [3.0] + [np.nan] * 4)


def test_npz_with_three_and_two_dimensional_x(tmp_path):
  x3 = np.arange(24, dtype=np.float64).reshape(2, 4, 3)
  np.savez(tmp_path / "a.npz", x=x3, y=np.array([7, 3]))
  x, labels = read_series(tmp_path / "a.npz")
  assert x.dtype == np.float32 and x.shape == (2, 4, 3)
  np.testing.assert_array_equal(labels, [7, 3])
  np.savez(tmp_path / "b.npz", x=np.ones((5, 4)))
  x, labels = read_series(tmp_path / "b.npz")
  assert x.shape == (5, 4, 1)
  np.testing.assert_array_equal(labels, np.zeros(5))  # no y: every label is 0


def test_reads_are_cached_until_the_file_changes(tmp_path):
  path = write_tsv(tmp_path / "a.tsv", [(1, [1.0, 2.0])])
  first = read_series(path)
  assert read_series(path)[0] is first[0]
  write_tsv(path, [(1, [1.0, 2.0, 3.0])])
  assert read_series(path)[0].shape == (1, 3, 1)


def bad_files(tmp_path):
  (tmp_path / "x.csv").write_text("1,2\n")
  (tmp_path / "empty.tsv").write_text("\n\n")
  np.savez(tmp_path / "noarrays.npz", y=np.zeros(2))
  np.savez(tmp_path / "rank4.npz", x=np.zeros((2, 3, 1, 1)))
  np.savez(tmp_path / "ylen.npz", x=np.zeros((2, 3)), y=np.zeros(3))
  return {
      "missing.tsv": "no such file",
      "x.csv": "unknown extension",
      "empty.tsv": "empty file",
      write_tsv(tmp_path / "word.tsv", [(1, [1.0, 2.0]), (2, [1.0, "oops"])]): "line 2: 'oops'",
      "noarrays.npz": "no array 'x'",
      "rank4.npz": r"x has shape \(2, 3, 1, 1\)",
      "ylen.npz": r"y has shape \(3,\) for 2 series",
      write_tsv(tmp_path / "hole.tsv", [(1, [1.0]), (2, ["NaN", None])]): "series 1 .* entirely missing",
  }


def test_errors_are_one_line_and_name_the_file(tmp_path):
  for name, message in bad_files(tmp_path).items():
    with pytest.raises(DataError, match=message) as error:
      read_series(tmp_path / name)
    assert "\n" not in str(error.value) and str(error.value).startswith(str(tmp_path / name))


def test_config_checks():
  SeriesDataConfig()  # builds without a file (``data.kind=series`` comes before data.train_file)
  for fields in ({"seq_len": 1}, {"eval_fraction": 1.0}, {"eval_fraction": 0.0}, {"batch_size": 0}):
    with pytest.raises(ConfigError):
      SeriesDataConfig(train_file="a.tsv", **fields)
  with pytest.raises(ConfigError, match="data.train_file: required"):
    SeriesSource(SeriesDataConfig(), 0, "train")
  with pytest.raises(DataError, match="no such file"):
    SeriesSource(SeriesDataConfig(train_file="nowhere.tsv"), 0, "train")


def test_held_out_split_is_disjoint_complete_deterministic_and_stratified(tmp_path):
  labels = [0] * 30 + [1] * 10 + [2] * 20
  path = write_tsv(tmp_path / "a.tsv", [(label, [float(i), float(label)]) for i, label in enumerate(labels)])
  cfg = SeriesDataConfig(train_file=path, eval_fraction=0.3, split_seed=4, standardize=False)
  train, held = SeriesSource(cfg, 0, "train"), SeriesSource(cfg, 99, "eval")  # the seed does not matter
  rows = lambda source: set(source.x[:, 0, 0].astype(int).tolist())
  assert rows(train).isdisjoint(rows(held)) and rows(train) | rows(held) == set(range(60))
  assert rows(SeriesSource(cfg, 1, "eval")) == rows(held)
  assert np.bincount(held.labels).tolist() == [9, 3, 6]
  np.testing.assert_array_equal(held.labels, held.x[:, 1, 0])
  other = SeriesSource(SeriesDataConfig(train_file=path, split_seed=5), 0, "eval")
  assert rows(other) != rows(held)
  np.testing.assert_array_equal(np.sort(list(rows(held))), stratified_subset(labels, 0.3, 4))


def test_standardization_uses_the_train_split_only(tmp_path):
  train = labelled_tsv(tmp_path / "train.tsv", [1, 2] * 20, length=8, offset=5.0)
  shifted = labelled_tsv(tmp_path / "eval.tsv", [1, 2] * 5, length=8, offset=50.0, seed=1)
  cfg = SeriesDataConfig(train_file=train, eval_file=shifted)
  a, b = SeriesSource(cfg, 0, "train"), SeriesSource(cfg, 0, "eval")
  assert abs(a.x.mean()) < 1e-5 and abs(a.x.std() - 1) < 1e-4
  assert b.x.mean() > 20  # (50 - 5) / std: eval is scaled with the training statistics
  np.testing.assert_array_equal(a.mean, b.mean)
  np.testing.assert_array_equal(a.std, b.std)
  assert abs(a.mean[0] - 5) < 0.5
  x, _ = read_series(train)
  held = SeriesSource(SeriesDataConfig(train_file=train), 0, "train")
  part = np.setdiff1d(np.arange(40), stratified_subset(np.array([1, 2] * 20), 0.3, 0))
  np.testing.assert_allclose(held.mean, [x[part].mean()], rtol=1e-5)


def test_standardize_ignores_missing_samples_and_keeps_them(tmp_path):
  path = write_tsv(tmp_path / "a.tsv", [(1, [1.0, 3.0, "NaN"]), (1, [1.0, 3.0]), (2, [1.0, 3.0, 1.0, 3.0])])
  source = SeriesSource(SeriesDataConfig(train_file=path, eval_file=path), 0, "train")
  np.testing.assert_allclose([source.mean[0], source.std[0]], [2.0, 1.0])
  np.testing.assert_array_equal(np.isnan(source.x[:, :, 0]), np.isnan(read_series(path)[0][:, :, 0]))


def test_seq_len_cuts_and_pads(tmp_path):
  path = write_tsv(tmp_path / "a.tsv", [(1, [1.0, 2.0, 3.0, 4.0]), (2, [5.0, 6.0])])
  for seq_len, first in ((0, [1, 2, 3, 4]), (3, [1, 2, 3]), (6, [1, 2, 3, 4, np.nan, np.nan])):
    cfg = SeriesDataConfig(train_file=path, eval_file=path, seq_len=seq_len, standardize=False)
    np.testing.assert_array_equal(SeriesSource(cfg, 0, "eval")[0]["x"][:, 0], first)


def test_labels_index_the_sorted_training_classes(tmp_path):
  train = write_tsv(tmp_path / "train.tsv", [(label, [1.0, 2.0]) for label in (10, -1, 2, 10)])
  cfg = SeriesDataConfig(train_file=train, eval_file=train)
  source = SeriesSource(cfg, 0, "train")
  assert source.classes == ("-1", "2", "10") and source.num_classes == 3 and source.num_channels == 1
  np.testing.assert_array_equal(source.labels, [2, 0, 1, 2])
  assert source[1]["label"].dtype == np.int32 and source[1]["x"].shape == (2, 1)
  unseen = write_tsv(tmp_path / "eval.tsv", [(2, [1.0, 2.0]), (7, [1.0, 2.0])])
  with pytest.raises(DataError, match="eval.tsv: label 7 does not occur in the training file"):
    SeriesSource(SeriesDataConfig(train_file=train, eval_file=unseen), 0, "eval")


def test_pipeline_batches_and_eval_covers_every_example_once(tmp_path):
  path = labelled_tsv(tmp_path / "a.tsv", [0, 1, 2] * 10, length=12)
  cfg = SeriesDataConfig(train_file=path, batch_size=4)
  batch = next(make_iterator(make_dataset(cfg, 0, "train")))
  assert batch["x"].shape == (4, 12, 1) and batch["x"].dtype == np.float32 and batch["label"].shape == (4,)
  held = SeriesSource(cfg, 0, "eval")
  batches = list(make_dataset(cfg, 0, "eval"))
  valid = np.concatenate([b["valid"] for b in batches]).astype(bool)
  assert valid.sum() == len(held) == 9 and len(valid) == 12
  np.testing.assert_array_equal(np.concatenate([b["x"] for b in batches])[valid], held.x)
  np.testing.assert_array_equal(np.concatenate([b["label"] for b in batches])[valid], held.labels)


@pytest.mark.parametrize("where, wafer_train, gun_train, gun_test", [
    ("fixtures", 16, 10, 10),  # the first rows of the archive's files, shipped in tests/fixtures/ucr
    ("shared", 1000, 50, 150)])  # the whole files, in ../shared/data (skips without it)
def test_real_ucr_files(where, wafer_train, gun_train, gun_test, request):
  ucr = UCR if where == "fixtures" else request.getfixturevalue("shared_data") / "ucr"
  x, labels = read_series(ucr / "Wafer" / "Wafer_TRAIN.tsv.gz")
  assert x.shape == (wafer_train, 152, 1) and set(labels.tolist()) == {-1, 1} and not np.isnan(x).any()
  cfg = SeriesDataConfig(train_file=str(ucr / "Wafer" / "Wafer_TRAIN.tsv.gz"))
  train, held = SeriesSource(cfg, 0, "train"), SeriesSource(cfg, 0, "eval")
  assert len(train) + len(held) == wafer_train and train.classes == ("-1", "1")
  gun = ucr / "GunPoint"
  cfg = SeriesDataConfig(train_file=str(gun / "GunPoint_TRAIN.tsv.gz"), eval_file=str(gun / "GunPoint_TEST.tsv.gz"))
  train, test = SeriesSource(cfg, 0, "train"), SeriesSource(cfg, 0, "eval")
  assert train.x.shape == (gun_train, 150, 1) and test.x.shape == (gun_test, 150, 1) and train.num_classes == 2

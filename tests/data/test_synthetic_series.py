"""The ``synthetic_series`` kind (PMT's cue task): every series regenerable from its index, the
splits disjoint, impossible settings one-line errors, the label recoverable from the series, and
the PMT family reading it through the Grain pipeline with the cue probe's gaps fitting."""

import flax.linen as nn
import jax
import numpy as np
import pytest

from conftest import REPO
from lpcjax import experiment, models
from lpcjax.config import ConfigError
from lpcjax.data import DataError, SyntheticSeriesConfig, SyntheticSeriesSource, make_dataset, synthetic_series
from lpcjax.evaluation.series import cue_placement

SMALL = SyntheticSeriesConfig(seq_len=64, batch_size=8, train_series=64, eval_series=16, test_series=16)


def test_every_series_is_regenerable_from_its_index():
  source = SyntheticSeriesSource(SMALL, 123, "train")  # the training seed is not the generator's
  assert source.x.shape == (64, 64, 1) and source.x.dtype == np.float32 and np.isfinite(source.x).all()
  for index in (0, 5, 63):
    x, label = synthetic_series(SMALL, "train", index)
    np.testing.assert_array_equal(source[index]["x"], x)
    assert source[index]["label"] == label == index % 4
  np.testing.assert_array_equal(SyntheticSeriesSource(SMALL, 0, "train").x, source.x)
  other = SyntheticSeriesConfig(**{**SMALL.__dict__, "generator_seed": 1})
  assert not np.allclose(SyntheticSeriesSource(other, 0, "train").x, source.x)
  assert np.bincount(source.labels).tolist() == [16] * 4 and source.classes[3] == "shapelets"


def test_splits_are_disjoint():
  series = {split: {x.tobytes() for x in SyntheticSeriesSource(SMALL, 0, split).x}
            for split in ("train", "eval", "test")}
  assert [len(s) for s in series.values()] == [64, 16, 16]  # no repeats within a split either
  assert not series["train"] & series["eval"] and not series["train"] & series["test"]
  assert not series["eval"] & series["test"]
  with pytest.raises(DataError, match="unknown split 'valid'"):
    SyntheticSeriesSource(SMALL, 0, "valid")


@pytest.mark.parametrize("fields,message", [
    ({"synthetic_classes": 5}, r"data.synthetic_classes: must be in \[2, 4\]"),
    ({"synthetic_noise": -1.0}, "data.synthetic_noise: must be a finite number >= 0"),
    ({"train_series": 16, "batch_size": 32}, "data.train_series: 16 series cannot fill a batch of 32"),
    ({"test_series": 2}, r"data.test_series: must be >= data.synthetic_classes \(4\)"),
    ({"seq_len": 16}, "data.seq_len: must be >= 24")])
def test_impossible_settings_are_one_line_errors(fields, message):
  with pytest.raises(ConfigError, match=message) as error:
    SyntheticSeriesConfig(**fields)
  assert "\n" not in str(error.value)


def band_powers(x, seq_len):
  """log power in four frequency bands: a trivial, fixed feature of a series."""
  power = np.abs(np.fft.rfft(x[..., 0], axis=1)) ** 2
  frequency = np.fft.rfftfreq(seq_len)
  edges = (0.0, 0.025, 0.05, 0.1, 0.51)
  return np.log(np.stack([power[:, (frequency >= a) & (frequency < b)].sum(1) for a, b in zip(edges, edges[1:])], 1))


def nearest_centroid_accuracy(config):
  train, test = (SyntheticSeriesSource(config, 0, split) for split in ("train", "test"))
  features = [band_powers(s.x, config.seq_len) for s in (train, test)]
  centroids = np.stack([features[0][train.labels == c].mean(0) for c in range(config.synthetic_classes)])
  predicted = np.argmin(((features[1][:, None] - centroids[None]) ** 2).sum(-1), axis=1)
  return np.mean(predicted == test.labels)


def test_the_label_is_recoverable_and_the_noise_makes_it_harder():
  sizes = dict(train_series=256, test_series=256)
  assert nearest_centroid_accuracy(SyntheticSeriesConfig(**sizes)) > 0.9  # chance 0.25
  assert nearest_centroid_accuracy(SyntheticSeriesConfig(**sizes, synthetic_noise=2.0)) < 0.8


def test_pmt_reads_the_kind_and_the_cue_gaps_fit():
  config = experiment.load_experiment("pmt:synthetic_cue", str(REPO / "configs"))
  assert isinstance(config.data, SyntheticSeriesConfig) and config.data.train_series >= 2000
  assert config.model.window_stride_fraction == 1.0  # the paper's non-overlapping cue protocol
  # The cue probe's gaps 0, 1, 2 whole windows fit every series of the default length.
  x = SyntheticSeriesSource(config.data, 0, "eval").x
  for gap in (0, 1, 2):
    spans, last = cue_placement(config.model, x, gap)
    assert (last == 4).all() and (spans[:, 0] >= 0).all()
  small = experiment.apply_overrides(config, [
      "data.train_series=64", "data.eval_series=8", "data.test_series=8", "data.batch_size=8", "model.d_model=16",
      "model.num_heads=2", "model.num_blocks=1", "model.tokenizer_kernels=8", "model.projection_dim=16"])
  batch = next(iter(make_dataset(small.data, 0, "train")))
  assert batch["x"].shape == (8, 128, 1) and batch["label"].shape == (8,)
  family = models.get("pmt")
  model = family.module_cls(small.model)
  # Shapes only (traced, not compiled: the end-to-end run is tests/evaluation/test_pmt_family.py's).
  variables = jax.eval_shape(lambda: nn.meta.unbox(family.init_variables(model, small.data, 0)))
  out = jax.eval_shape(model.apply, variables, batch["x"])
  assert out["memories"].shape == (8, 5, 1, 16) and out["cls"].shape == (8, 16)


def test_pmt_config_variants_combine():
  load = lambda name: experiment.load_experiment(f"pmt:{name}", str(REPO / "configs"))
  no_pcl, full = load("synthetic_cue_no_pcl"), load("synthetic_cue_full")
  assert no_pcl.model.pcl_weight == 0 and no_pcl.model.window_stride_fraction == 1.0
  assert full.model.attention == "full" and full.model.window_stride_fraction == 1.0
  assert load("tiny_full_matched").model.num_blocks == 6
  with pytest.raises(ConfigError, match="variants"):
    load("synthetic_cue_cue")

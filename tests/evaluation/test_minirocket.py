"""The MiniRocket control (lpcjax.evaluation.minirocket): it separates what it should where aeon is
installed (the [rocket] extra), and says in one line which extra is missing where it is not."""

import argparse
import sys

import numpy as np
import pytest

from lpcjax.errors import UserError
from lpcjax.evaluation.minirocket import minirocket_features
from lpcjax.evaluation.series import raw_controls
from lpcjax.evaluation.series_probes import linear_probe


def shapes(n, seed):
  """Sines against square waves of random phase, [n, 64, 1], labels [n]: no linear template in
  the raw samples, an easy case for convolution features."""
  rng = np.random.default_rng(seed)
  labels = np.arange(n) % 2
  t = np.linspace(0, 4 * np.pi, 64)[None] + rng.uniform(0, 2 * np.pi, (n, 1))
  x = np.where(labels[:, None] == 0, np.sin(t), np.sign(np.sin(t))) + 0.1 * rng.normal(size=(n, 64))
  return x[..., None].astype(np.float32), labels


def test_minirocket_and_ridge_separate_sines_from_square_waves():
  pytest.importorskip("aeon", reason="the MiniRocket control needs the [rocket] extra")
  (train_x, train_y), (test_x, test_y) = shapes(40, 0), shapes(40, 1)
  train, test = minirocket_features(train_x, test_x, num_kernels=840)
  assert train.shape[0] == 40 and test.shape == (40, train.shape[1]) and np.isfinite(train).all()
  out = linear_probe(train, train_y, test, test_y, fractions=(1.0,), seeds=(0,), classifier="ridge")
  assert out["fractions"]["1.0"]["accuracy"] > 0.9


def test_without_aeon_the_control_names_the_extra(monkeypatch):
  monkeypatch.setitem(sys.modules, "aeon.transformations.collection.convolution_based", None)  # import fails
  x, y = shapes(8, 0)
  split = argparse.Namespace(x=x, labels=y)
  options = argparse.Namespace(controls=("raw", "minirocket"), fractions=(1.0,), seeds=1, classifier="svm",
                               features="cls")
  with pytest.raises(UserError, match=r"^the MiniRocket control needs aeon: pip install 'lpcjax\[rocket\]'$"):
    raw_controls({"train": split, "eval": split}, options)

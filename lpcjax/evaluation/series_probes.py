"""Probes on frozen time-series features (PMT spec §11), independent of the model: linear
probes on label fractions, and the cue-retention probe (a Hann burst some gap before the end;
can the end-of-sequence features still tell which series had one?)."""

import os
import warnings

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from sklearn.linear_model import LogisticRegression, RidgeClassifierCV  # noqa: E402
from sklearn.metrics import accuracy_score, f1_score, roc_auc_score  # noqa: E402
from sklearn.neighbors import KNeighborsClassifier  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402
from sklearn.svm import LinearSVC  # noqa: E402

from ..data.subsets import stratified_subset  # noqa: E402
from ..errors import warn  # noqa: E402
from .plots import finish_plot  # noqa: E402

CLASSIFIERS = ("svm", "logistic", "1nn", "ridge")


def _check_finite(name, features):
  features = np.asarray(features, np.float64)
  if features.ndim != 2:
    raise ValueError(f"{name}: expected features [N, D], got shape {features.shape}")
  if not np.isfinite(features).all():
    raise ValueError(f"{name}: features contain NaN or inf ({(~np.isfinite(features)).sum()} values)")
  return features


def _classifier(kind):
  if kind == "svm":  # the paper's protocol: a linear SVM with the default C, no tuning
    return LinearSVC(C=1.0, dual="auto", max_iter=10000)
  if kind == "1nn":  # the time-series classification control: Euclidean 1-NN
    return KNeighborsClassifier(n_neighbors=1)
  if kind == "ridge":  # MiniRocket's classifier (minirocket.py): the penalty by leave-one-out over 10^-3..10^3
    return RidgeClassifierCV(alphas=np.logspace(-3, 3, 10))
  return LogisticRegression(max_iter=1000)


def _fit_predict(kind, train_x, train_y, test_x):
  """Standardize with the training subset's statistics (not for 1-NN, whose distance is over
  the series as given), fit, predict the test set."""
  if kind == "1nn":
    return _classifier(kind).fit(train_x, train_y).predict(test_x)
  scaler = StandardScaler().fit(train_x)
  with warnings.catch_warnings():  # a probe that did not fully converge still says something
    warnings.simplefilter("ignore", ConvergenceWarning)
    model = _classifier(kind).fit(scaler.transform(train_x), train_y)
  return model.predict(scaler.transform(test_x))


def linear_probe(train_features, train_labels, test_features, test_labels, *, fractions=(0.01, 0.05, 1.0),
                 seeds=(0, 1, 2, 3, 4), classifier="svm"):
  """Accuracy and macro-F1 of a classifier (linear, or the 1-NN control) on stratified label
  fractions, mean and std (over seeds, ddof 0) per fraction. Subsets that coincide (fraction
  1.0) are fitted once. A fraction whose subsets are those of a smaller one (a small set: one
  label per class either way) is marked ``same_as`` that fraction, with a one-line warning:
  tables print one row for both."""
  if classifier not in CLASSIFIERS:
    raise ValueError(f"linear probe: classifier must be one of {CLASSIFIERS}, got {classifier!r}")
  train_x = _check_finite("linear probe (train)", train_features)
  test_x = _check_finite("linear probe (test)", test_features)
  train_y, test_y = np.asarray(train_labels), np.asarray(test_labels)
  if len(train_y) != len(train_x) or len(test_y) != len(test_x):
    raise ValueError(f"linear probe: {len(train_x)}/{len(test_x)} feature rows but {len(train_y)}/{len(test_y)} labels")
  classes = np.unique(train_y)
  if len(classes) < 2:
    raise ValueError(f"linear probe: the training labels have one class ({classes.tolist()})")
  if not seeds:
    raise ValueError("linear probe: no seeds given")
  fitted = {}  # subset indices -> (accuracy, macro-F1)
  subsets = {}  # the subsets of every seed -> the first fraction that drew them
  out = {"classifier": classifier, "fractions": {}}
  for fraction in sorted(fractions):  # smallest first: a larger fraction is marked same_as it
    per_seed, keys = [], []
    for seed in seeds:
      index = stratified_subset(train_y, fraction, seed)
      key = index.tobytes()
      keys.append(key)
      if key not in fitted:
        predicted = _fit_predict(classifier, train_x[index], train_y[index], test_x)
        fitted[key] = (float(accuracy_score(test_y, predicted)),
                       float(f1_score(test_y, predicted, average="macro", zero_division=0)))
      accuracy, macro_f1 = fitted[key]
      per_seed.append({"seed": int(seed), "labels": int(len(index)), "accuracy": accuracy, "macro_f1": macro_f1})
    cell = {"labels": float(np.mean([r["labels"] for r in per_seed])), "per_seed": per_seed}
    for metric in ("accuracy", "macro_f1"):
      values = [r[metric] for r in per_seed]
      cell[metric], cell[f"{metric}_std"] = float(np.mean(values)), float(np.std(values))
    first = subsets.setdefault(tuple(keys), str(float(fraction)))
    if first != str(float(fraction)):
      cell["same_as"] = first
      warn(f"linear probe: {float(fraction):.0%} and {float(first):.0%} of the {len(train_y)} training labels draw "
           f"the same subsets ({cell['labels']:.0f} labels): one row")
    out["fractions"][str(float(fraction))] = cell
  return out


def cue_span(length, gap_ratio, width=0.2):
  """(start, end) of the cue in a series of ``length`` samples; it ends gap_ratio * length
  samples before the end and spans max(3, round(width * length)) samples."""
  size = max(3, int(round(width * length)))
  end = length - int(round(gap_ratio * length))
  if not gap_ratio >= 0 or end - size < 0:
    raise ValueError(f"cue does not fit: gap_ratio={gap_ratio}, width={width} in a series of {length} samples")
  return end - size, end


def insert_cue(x, where, *, amplitude=0.5, width=0.2, channel=0):
  """A copy of x [N, T, C] with a Hann burst of amplitude * sigma added to one channel, sigma =
  each series' std of that channel outside the cue span (so the cue does not scale itself).
  ``where``: a gap ratio (every series: ``cue_span``) or int spans [N, 2] of (start, end)
  samples, one per series (series of different valid lengths). NaNs (missing samples) stay
  NaN; a series with no finite sample outside the span gets no cue."""
  x = np.array(x, dtype=np.result_type(np.asarray(x).dtype, np.float32))
  if x.ndim != 3:
    raise ValueError(f"insert_cue: expected x [N, T, C], got shape {x.shape}")
  if not -x.shape[2] <= channel < x.shape[2]:
    raise ValueError(f"insert_cue: channel {channel} out of range for {x.shape[2]} channels")
  if np.ndim(where) == 0:
    spans = np.tile(cue_span(x.shape[1], where, width), (len(x), 1))
  else:
    spans = np.asarray(where, np.int64)
    if spans.shape != (len(x), 2) or (spans[:, 0] < 0).any() or (spans[:, 1] > x.shape[1]).any() or (
        spans[:, 1] - spans[:, 0] < 1).any():
      raise ValueError(f"insert_cue: spans must be [N={len(x)}, 2] of 0 <= start < end <= {x.shape[1]}")
  for i, (start, end) in enumerate(spans):
    outside = np.concatenate([x[i, :start, channel], x[i, end:, channel]])
    with warnings.catch_warnings():  # all-NaN series: nanstd warns and gives NaN, taken as 0 below
      warnings.simplefilter("ignore", RuntimeWarning)
      sigma = np.nan_to_num(np.nanstd(outside.astype(np.float64)))
    x[i, start:end, channel] += (amplitude * sigma * np.hanning(end - start)).astype(x.dtype)
  return x


def cue_dataset(x, where, seed, **cue_kwargs):
  """(x with the cue in a seeded random half of the series (exactly N // 2), has_cue int [N]);
  ``where`` as in ``insert_cue`` (spans: one row per series of x)."""
  x = np.asarray(x)
  cued = np.random.default_rng(seed).choice(len(x), size=len(x) // 2, replace=False)
  has_cue = np.zeros(len(x), np.int64)
  has_cue[cued] = 1
  out = np.array(x, dtype=np.result_type(x.dtype, np.float32))
  out[cued] = insert_cue(x[cued], where if np.ndim(where) == 0 else np.asarray(where)[cued], **cue_kwargs)
  return out, has_cue


def cue_probe(train_features, train_has_cue, test_features, test_has_cue):
  """EOS probe: logistic regression on standardized features; AUC of P(cue), top-1 and
  macro-F1 at p = 0.5."""
  train_x = _check_finite("cue probe (train)", train_features)
  test_x = _check_finite("cue probe (test)", test_features)
  train_y, test_y = np.asarray(train_has_cue).astype(int), np.asarray(test_has_cue).astype(int)
  for name, y in (("train", train_y), ("test", test_y)):
    if len(np.unique(y)) != 2:
      raise ValueError(f"cue probe: the {name} set needs series with and without the cue, got {np.unique(y).tolist()}")
  scaler = StandardScaler().fit(train_x)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", ConvergenceWarning)
    model = LogisticRegression(max_iter=1000).fit(scaler.transform(train_x), train_y)
  p = model.predict_proba(scaler.transform(test_x))[:, list(model.classes_).index(1)]
  predicted = (p > 0.5).astype(int)
  return {"auc": float(roc_auc_score(test_y, p)), "top1": float(accuracy_score(test_y, predicted)),
          "macro_f1": float(f1_score(test_y, predicted, average="macro", zero_division=0))}


def _nothing_to_plot(fig, path):
  plt.close(fig)
  if os.path.exists(path):  # an earlier evaluation's plot would no longer describe this one
    os.remove(path)


def _save(fig, ax, path, title, xlabel, ylabel, legend_outside=False):
  ax.set_title(title)
  finish_plot(fig, ax, path, xlabel, ylabel, legend_outside=legend_outside)
  return path


def plot_cue_auc(curves, path, gap_label="gap ratio (cue end to series end, fraction of length)"):
  """curves: {model label: {gap: (auc mean, auc std)}}. EOS AUC against the gap (in the units
  ``gap_label`` names), one line per model. Returns path, or None (writing nothing) when no
  curve has a finite point."""
  fig, ax = plt.subplots(figsize=(6, 4))
  drawn, whole = False, True
  for label, curve in (curves or {}).items():
    points = sorted((float(g), float(m), float(s)) for g, (m, s) in curve.items() if np.isfinite(m))
    if points:
      gaps, means, stds = zip(*points)
      ax.errorbar(gaps, means, yerr=np.nan_to_num(stds), fmt="o-", capsize=3, label=label)
      drawn, whole = True, whole and all(g == int(g) for g in gaps)
  if not drawn:
    return _nothing_to_plot(fig, path)
  if whole:  # gaps counted in whole windows (or strides): no ticks between them
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  ax.axhline(0.5, color="gray", linestyle=":", label="chance")
  ax.set_ylim(0.4, 1.02)
  return _save(fig, ax, path, "Cue retention (EOS probe)", gap_label, "ROC-AUC (mean ± std over seeds)")


def plot_probe_accuracy(results, path):
  """results: {model label: linear_probe output}. Grouped bars of accuracy per label fraction
  with the std over seeds. Returns path, or None (writing nothing) when there are no cells."""
  fig, ax = plt.subplots(figsize=(6.5, 4))
  results = {label: {f: c for f, c in r["fractions"].items() if "same_as" not in c}
             for label, r in (results or {}).items() if r and r.get("fractions")}
  fractions = sorted({f for cells in results.values() for f in cells}, key=float)
  if not fractions:
    return _nothing_to_plot(fig, path)
  width = 0.8 / len(results)
  for i, (label, cells) in enumerate(results.items()):
    xs = [j + (i - (len(results) - 1) / 2) * width for j, f in enumerate(fractions) if f in cells]
    ax.bar(xs, [cells[f]["accuracy"] for f in fractions if f in cells], width,
           yerr=[cells[f]["accuracy_std"] for f in fractions if f in cells], capsize=3, label=label)
  ax.set_xticks(range(len(fractions)), [f"{float(f) * 100:g}%" for f in fractions])
  ax.set_ylim(0, 1.05)
  return _save(fig, ax, path, "Linear probe", "fraction of training labels", "test accuracy (mean ± std over seeds)",
               legend_outside=True)  # inside, it covered the bars near accuracy 1

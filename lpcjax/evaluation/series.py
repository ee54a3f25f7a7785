"""The evaluator of time-series encoders (``pmt``): frozen features, then the paper's probes.

* Linear probes (pmt-spec.md §11): features of the training split (``--features``: [CLS] by
  default) fit a linear SVM (or logistic regression) on 1 %, 5 % and 100 % of the labels
  (stratified, over ``--seeds`` seeds), scored on the evaluation split: accuracy and macro-F1.
* Cue retention (§11): a Hann burst of 0.5 σ over 20 % of the series on channel 0, in a seeded
  half of the series of each split, ending g windows (g × S tokens × S_p samples) before the
  first sample of the final window, so that the cue is upstream of the final window and only
  memory can carry it (gaps where the cue does not fit in the series are skipped); a logistic
  regression on the standardized features of the final window only (the last block's memory of
  the last window, mean over slots; the baseline's mean of that window's tokens): ROC-AUC, top-1
  and macro-F1 per gap, over seeds. The paper ran this probe with non-overlapping windows
  (``model.window_stride`` = W) and counts the gap in windows as here.

``--random-init`` evaluates the run's architecture with fresh weights (the "randomly
initialized" row). Results: ``series_probes.json`` and two plots (probe accuracy, AUC against
gap) in the output folder.
"""

import os

import flax.linen as nn
import jax
import numpy as np

from lpcjax import data
from lpcjax.data import DataError
from lpcjax.files import write_json_atomic

from . import series_probes


def _floats(text):
  return tuple(float(part) for part in text.split(",") if part)


class SeriesEvaluator:
  def add_arguments(self, parser):
    parser.add_argument("--probes", default="linear,cue", help="which probes: linear, cue (comma-separated)")
    parser.add_argument("--features", default="cls", choices=("cls", "memory", "tokens"),
                        help="linear-probe features: [CLS], the mean of the final memories, or the mean token")
    parser.add_argument("--fractions", type=_floats, default=(0.01, 0.05, 1.0), help="label fractions")
    parser.add_argument("--seeds", type=int, default=5, help="label subsets (and cue placements) per setting")
    parser.add_argument("--classifier", default="svm", choices=("svm", "logistic"))
    parser.add_argument("--gaps", type=_floats, default=(0, 1, 2, 4),
                        help="cue gaps: windows between the cue's end and the final window's start")
    parser.add_argument("--random-init", action="store_true", help="fresh weights instead of the checkpoint's")
    parser.add_argument("--feature-batch", type=int, default=64, help="series per forward pass")

  def evaluate(self, run, options):
    config = run.config
    splits = {split: data.make_source(config.data, config.train.seed, split) for split in ("train", "eval")}
    variables = run.variables
    if options.random_init:
      variables = nn.meta.unbox(run.family.init_variables(run.model, config.data, config.train.seed))
      variables = {"params": variables["params"], **{k: variables[k] for k in run.family.mutable}}
    encode = jax.jit(lambda v, x: run.model.apply(v, x))
    label = config.name + (" (random init)" if options.random_init else "")
    result = {"run": run.run_dir, "label": label, "step": 0 if options.random_init else run.step,
              "train_series": len(splits["train"]), "eval_series": len(splits["eval"])}

    # Every forward pass has this many series (the last ones padded): one compilation for both
    # splits and every probe, not one per split size and remainder.
    width = min(options.feature_batch, max(len(splits["train"]), len(splits["eval"])))

    def features(x):
      out = []
      for i in range(0, len(x), width):
        chunk = x[i:i + width]
        padding = np.zeros((width - len(chunk), *chunk.shape[1:]), chunk.dtype)
        encoded = jax.device_get(encode(variables, np.concatenate([chunk, padding])))
        out.append({name: value[:len(chunk)] for name, value in encoded.items()})
      return {name: np.concatenate([o[name] for o in out]) for name in ("cls", "tokens", "token_valid", "memories")}

    probes = set(options.probes.split(","))
    unknown = probes - {"linear", "cue"}
    if unknown:
      raise DataError(f"--probes: unknown probe {sorted(unknown)[0]!r}; choose linear, cue")
    if "linear" in probes and len(np.unique(splits["train"].labels)) < 2:
      raise DataError(f"linear probe: the training labels of {config.data.train_file} have one class; "
                      "pre-training ignores labels, the probe needs two (--probes cue)")
    if "linear" in probes:
      train, test = features(splits["train"].x), features(splits["eval"].x)
      result["linear"] = series_probes.linear_probe(
          linear_features(train, options.features), splits["train"].labels,
          linear_features(test, options.features), splits["eval"].labels,
          fractions=options.fractions, seeds=tuple(range(options.seeds)), classifier=options.classifier)
      result["linear"]["features"] = options.features
    if "cue" in probes:
      result["cue"], length = {}, splits["train"].x.shape[1]
      for gap in options.gaps:
        gap_ratio = cue_gap_ratio(config.model, length, gap)
        if gap_ratio is None:
          continue
        scores = []
        for seed in range(options.seeds):
          x_train, y_train = series_probes.cue_dataset(splits["train"].x, gap_ratio, seed)
          x_test, y_test = series_probes.cue_dataset(splits["eval"].x, gap_ratio, 10_000 + seed)
          scores.append(series_probes.cue_probe(final_window(features(x_train)), y_train,
                                                final_window(features(x_test)), y_test))
        result["cue"][str(gap)] = {name: float(np.mean([s[name] for s in scores])) for name in scores[0]}
        result["cue"][str(gap)]["auc_std"] = float(np.std([s["auc"] for s in scores]))
        result["cue"][str(gap)]["gap_ratio"] = gap_ratio
    return result

  def write(self, results, out_dir, options):
    write_json_atomic(os.path.join(out_dir, "series_probes.json"), results)
    series_probes.plot_probe_accuracy({r["label"]: r["linear"] for r in results if "linear" in r},
                                      os.path.join(out_dir, "probe_accuracy.png"))
    curves = {r["label"]: {float(g): (c["auc"], c["auc_std"]) for g, c in r["cue"].items()}
              for r in results if "cue" in r}
    series_probes.plot_cue_auc(curves, os.path.join(out_dir, "cue_auc.png"),
                               gap_label="gap: windows between the cue's end and the final window")

  def report(self, result):
    lines = [f"{result['label']} (step {result['step']}): {result['train_series']} training / "
             f"{result['eval_series']} evaluation series"]
    for fraction, cell in result.get("linear", {}).get("fractions", {}).items():
      lines.append(f"  linear probe, {float(fraction):.0%} labels ({cell['labels']:.0f}): accuracy "
                   f"{cell['accuracy']:.3f} ± {cell['accuracy_std']:.3f}, macro-F1 {cell['macro_f1']:.3f}")
    for gap, cell in result.get("cue", {}).items():
      lines.append(f"  cue {float(gap):g} windows before the final one: AUC {cell['auc']:.3f} ± {cell['auc_std']:.3f}, "
                   f"top-1 {cell['top1']:.3f}, macro-F1 {cell['macro_f1']:.3f}")
    return lines


def cue_gap_ratio(model_config, length, gap_windows, width=0.2):
  """The cue's distance from the series end, as a fraction of the series (what
  ``series_probes.cue_dataset`` takes), for a cue ending ``gap_windows`` windows before the
  first sample of the final window; None when the cue would not fit."""
  window, stride, n = model_config.geometry(model_config.num_tokens(length))
  step = stride * model_config.patch_stride  # samples per window step
  end = int(round((n - 1 - gap_windows) * step))
  if end - max(3, int(round(width * length))) < 0:
    return None
  return (length - end) / length


def linear_features(outputs, kind):
  """[N, d] features for the linear probes."""
  if kind == "cls":
    return outputs["cls"]
  if kind == "memory":
    return outputs["memories"].mean(axis=(1, 2))
  valid = outputs["token_valid"][..., None]
  return (outputs["tokens"] * valid).sum(1) / np.maximum(valid.sum(1), 1)


def final_window(outputs):
  """[N, d]: the last window's memory (mean over slots), the cue probe's features. (For a series
  whose final window is all missing samples, that memory only carries earlier windows.)"""
  return outputs["memories"][:, -1].mean(axis=1)

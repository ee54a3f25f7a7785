"""Seeded, stratified subsets of a labelled set: held-out evaluation splits and the label
fractions of linear probes (1 %, 5 %, 100 % of the labels)."""

import numpy as np


def stratified_subset(labels, fraction, seed):
  """Sorted indices of about ``fraction`` of ``labels`` [N], drawn per class (seeded).

  Each class keeps round(fraction * its count) examples, and at least one, so a probe trained on
  1 % of a small set still sees every class. ``fraction >= 1`` returns every index.
  """
  labels = np.asarray(labels)
  if not 0 < fraction:
    raise ValueError(f"label fraction must be > 0, got {fraction}")
  if fraction >= 1:
    return np.arange(len(labels))
  rng = np.random.default_rng(seed)
  chosen = []
  for label in np.unique(labels):
    members = np.flatnonzero(labels == label)
    count = min(len(members), max(1, int(round(fraction * len(members)))))
    chosen.append(rng.choice(members, size=count, replace=False))
  return np.sort(np.concatenate(chosen))

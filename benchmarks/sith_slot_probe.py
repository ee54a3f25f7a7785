"""How much of a lone identifier SITH's slots keep (docs/mechanisms.md, the SITH diagnosis).

The delayed_id_near layout at k = 1 with the mechanism suite's SITH (L = 27, k = 100, M = 91): a
lone identifier from [128, 256) sits ``--lag`` tokens before the predicted chunk, distractors from
[2, 128) fill the rest of the history. Prints its share of each slot's filter weight and the
held-out accuracy of a ridge probe from the LayerNormed slots (random embeddings, std 0.02, as
the model starts) to the identifier; ``--repeat r`` writes it r times in a row (delayed_id_repeat).
A probe far above chance says the slots hold the identifier and a model has a read-out to find.

  python benchmarks/sith_slot_probe.py                 # a lone identifier 42 tokens back
  python benchmarks/sith_slot_probe.py --repeat 6
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from results_file import write_results  # noqa: E402

from lpcjax.layers.sith import TABLE_C, sith_filters  # noqa: E402

VOCAB, HALF = 256, 128


def slots_and_ids(rng, filters, embeddings, count, lag, repeat):
  """``count`` histories -> (LayerNormed slots flattened [count, L * d], identifier classes)."""
  horizon = filters.shape[1]
  tokens = rng.integers(2, HALF, size=(count, horizon))
  ids = rng.integers(HALF, VOCAB, size=count)
  for r in range(repeat):  # the run ends ``lag`` tokens before the chunk and extends further back
    tokens[:, horizon - lag - r] = ids
  # history[:, M - t'] is t' tokens back: the reversed filters align with it (lpcjax.layers.sith)
  slots = np.einsum("lm,bmd->bld", filters[:, ::-1], embeddings[tokens])
  slots = (slots - slots.mean(-1, keepdims=True)) / slots.std(-1, keepdims=True)
  return slots.reshape(count, -1), ids - HALF


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--lag", type=int, default=42, help="tokens between the identifier and the chunk")
  parser.add_argument("--repeat", type=int, default=1)
  parser.add_argument("--num-filters", type=int, default=27)
  parser.add_argument("--k", type=float, default=100.0)
  parser.add_argument("--dim", type=int, default=64)
  parser.add_argument("--train", type=int, default=6000)
  parser.add_argument("--test", type=int, default=1000)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()
  filters = sith_filters(args.num_filters, args.k, TABLE_C).astype(np.float64)
  rng = np.random.default_rng(args.seed)
  embeddings = rng.normal(0.0, 0.02, (VOCAB, args.dim))
  lags = np.arange(args.lag, args.lag + args.repeat)
  share = filters[:, lags - 1].sum(1) / filters.sum(1)  # column t' - 1 is t' tokens back
  x_train, y_train = slots_and_ids(rng, filters, embeddings, args.train, args.lag, args.repeat)
  x_test, y_test = slots_and_ids(rng, filters, embeddings, args.test, args.lag, args.repeat)
  one_hot = np.eye(VOCAB - HALF)[y_train]
  gram = x_train.T @ x_train
  probes = {}
  for ridge in (0.1, 1.0, 10.0):
    weights = np.linalg.solve(gram + ridge * np.eye(len(gram)), x_train.T @ one_hot)
    probes[f"{ridge:g}"] = float(((x_test @ weights).argmax(1) == y_test).mean())
  best = np.argsort(share)[::-1][:3]
  print(f"identifier {args.lag} tokens back, written {args.repeat}x; L = {args.num_filters}, k = {args.k:g}")
  print("| slot | tau* | identifier's share of its weight |\n|---|---|---|")
  taus = (1 + TABLE_C) ** np.arange(args.num_filters)
  for i in best:
    print(f"| {i} | {taus[i]:.1f} | {100 * share[i]:.1f}% |")
  print("| ridge | held-out probe accuracy (chance 0.8%) |\n|---|---|")
  for ridge, accuracy in probes.items():
    print(f"| {ridge} | {100 * accuracy:.1f}% |")
  write_results(f"sith_slot_probe_lag{args.lag}_r{args.repeat}",
                {"args": vars(args), "best_slot_share": float(share.max()), "probe_accuracy": probes})


if __name__ == "__main__":
  main()

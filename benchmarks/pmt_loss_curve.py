"""The pre-training loss curve of one PMT run, from its metrics.jsonl: the logged training loss
and its three terms (each a mean over ``log_every`` steps), the held-out losses of its
evaluations, and where the curve flattens (the first logged step after which the smoothed
training loss falls by less than ``--flat`` of its total fall).

  python benchmarks/pmt_loss_curve.py runs/<run> [--plot docs/pmt_loss_curve.png] [--out FILE]
"""

import argparse
import json
import os
import sys

import numpy as np
from results_file import write_results


def read_curve(run):
  rows = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl")) if line.strip()]
  train = [r for r in rows if "loss" in r]
  held_out = [r for r in rows if "eval_loss" in r]
  curve = {"step": [r["step"] for r in train],
           **{name: [r[name] for r in train] for name in ("loss", "icl", "hgcl", "pcl") if name in train[0]}}
  evals = {"step": [r["step"] for r in held_out],
           **{name: [r[f"eval_{name}"] for r in held_out] for name in ("loss", "icl", "hgcl", "pcl")
              if held_out and f"eval_{name}" in held_out[0]}}
  return curve, evals


def flattening_step(steps, loss, flat, smooth=4):
  """The first step from which the smoothed loss (moving mean of ``smooth`` logged points) falls
  by less than ``flat`` of its whole fall over the rest of the run; None for a curve too short."""
  if len(loss) < 2 * smooth:
    return None
  smoothed = np.convolve(loss, np.ones(smooth) / smooth, mode="valid")
  total = smoothed[0] - smoothed.min()
  for i in range(len(smoothed)):
    if smoothed[i] - smoothed[i:].min() < flat * total:
      return int(steps[i + smooth - 1])
  return None


def plot(curve, evals, path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6.4, 3.8))
  for name in ("loss", "icl", "hgcl", "pcl"):
    if name in curve:
      ax.plot(curve["step"], curve[name], label=f"train {name}")
  if evals.get("loss"):
    ax.plot(evals["step"], evals["loss"], "ko--", label="held-out loss")
  ax.set_xlabel("step")
  ax.set_ylabel("loss")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("run")
  parser.add_argument("--flat", type=float, default=0.05, help="fraction of the total fall left: flat")
  parser.add_argument("--plot", default=None)
  parser.add_argument("--out", default=None,
                      help="JSON path (default benchmarks/results/pmt_loss_curve_<run>_<backend>.json)")
  args = parser.parse_args()
  name = os.path.basename(os.path.normpath(args.run))
  curve, evals = read_curve(args.run)
  flat_at = flattening_step(curve["step"], curve["loss"], args.flat)
  config = json.load(open(os.path.join(args.run, "config.json")))
  print(f"{args.run}: {len(curve['step'])} logged points to step {curve['step'][-1]}; training loss "
        f"{curve['loss'][0]:.3f} -> {curve['loss'][-1]:.3f}; flat (< {args.flat:.0%} of the fall left) "
        f"from step {flat_at}")
  for step, loss in zip(evals["step"], evals.get("loss", [])):
    print(f"  held-out loss at step {step}: {loss:.3f}")
  if args.plot:
    plot(curve, evals, args.plot)
  # The run names the default file, so measuring another run never replaces a committed curve.
  figures = {"command": " ".join(sys.argv), "run": name, "config": config.get("name"),
             "train_file": config["data"].get("train_file"), "steps": config["train"]["steps"],
             "flat_fraction": args.flat, "flat_from_step": flat_at, "train": curve, "held_out": evals}
  write_results(f"pmt_loss_curve_{name}", figures, args.out)


if __name__ == "__main__":
  main()

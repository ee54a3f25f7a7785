"""Every PMT gate along a short pre-training run: the parameter values ``gate_values`` reads (the
carry share σ(θ_g), the write gate's opening at zero input σ(b_u/T_u), the read gate's σ(b_r), the
SkipGate, γ) and the openings the write and read gates actually have on a fixed batch of training
series (``gate_openings``: mean and std over windows and series), every ``--every`` steps.

  python benchmarks/pmt_gates.py --set Wafer --steps 100 --every 10 [--plot docs/pmt_gates.png]

The recipe is ``pmt:tiny``'s (the gate group, lr 1e-3, cosine over ``--steps``), trained by
train.py's loop (``lpcjax.training.train``: the Grain pipeline, the jitted step) in a temporary
run directory; a ``Hook`` reads the gates every ``--every`` steps (and before the first), another
the training loss of every step. Issue #37: the write gate's bias looked stuck while its opening
moved.
"""

import argparse
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from results_file import write_results

from lpcjax import data, experiment
from lpcjax.layers.pma import gate_openings, gate_values
from lpcjax.training import Hook, train

UCR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "shared", "data",
                   "ucr")


def trajectory(args):
  train_file = os.path.join(UCR, args.set, f"{args.set}_TRAIN.tsv.gz")
  config = experiment.apply_overrides(experiment.load_experiment(f"configs/pmt.py:{args.config}"),
                                      [f"data.train_file={train_file}", f"train.steps={args.steps}",
                                       "train.eval_every=0", "train.checkpoint_every=0", *args.extra])
  probe = jnp.asarray(np.asarray(data.make_source(config.data, 0, "train").x)[:64])
  points, losses = [], []

  def read_gates(step, state, metrics):
    sown = state.apply_fn({"params": state.params, **state.mutable}, probe, mutable=["intermediates"])[1]
    gates = gate_values(state.params["pma"])
    for block, opened in gate_openings(sown["intermediates"]["pma"]).items():
      gates[block].update(opened)
    points.append({"step": step, "gates": jax.tree.map(float, gates)})

  def read_loss(step, state, metrics):
    losses.append(float(metrics["loss"][0] / metrics["loss"][1]))

  with tempfile.TemporaryDirectory() as run_dir:
    config = experiment.apply_overrides(config, [f"train.run_dir={run_dir}", "train.run_name=gates"])
    train(config, progress=False, hooks=[Hook(args.every, read_gates, at_start=True), Hook(1, read_loss)])
  return config, points, losses


def plot(points, path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  steps = [p["step"] for p in points]
  blocks = list(points[0]["gates"])
  names = [("carry", "carry σ(θ_g)"), ("write_u0", "write σ(b_u/T_u)"), ("write_open", "write opening u"),
           ("read", "read σ(b_r)"), ("read_open", "read opening"), ("skip", "SkipGate σ(θ_s)"), ("gamma", "γ")]
  fig, axes = plt.subplots(1, len(blocks), figsize=(4.2 * len(blocks), 3.6), sharey=True)
  for ax, block in zip(np.atleast_1d(axes), blocks):
    for key, label in names:
      values = [p["gates"][block].get(key) for p in points]
      if None not in values:
        ax.plot(steps, values, label=label, linestyle="--" if key in ("write_u0", "read") else "-")
    ax.set_title(block)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
  np.atleast_1d(axes)[0].set_ylabel("value")
  np.atleast_1d(axes)[-1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--set", default="Wafer")
  parser.add_argument("--config", default="tiny", help="the configs/pmt.py name")
  parser.add_argument("--steps", type=int, default=100)
  parser.add_argument("--every", type=int, default=10)
  parser.add_argument("--extra", nargs="*", default=[], help="config overrides")
  parser.add_argument("--plot", default=None, help="PNG path for the figure")
  parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/pmt_gates_<backend>.json)")
  args = parser.parse_args()
  start = time.perf_counter()
  config, points, losses = trajectory(args)
  for p in points:
    print(f"step {p['step']:>4}: " + "; ".join(f"{b} " + " ".join(f"{k} {v:.3f}" for k, v in g.items())
                                              for b, g in p["gates"].items()))
  if args.plot:
    plot(points, args.plot)
  write_results("pmt_gates", {"command": " ".join(sys.argv), "set": args.set, "config": config.name,
                              "steps": args.steps, "trajectory": points, "train_loss": losses,
                              "seconds": time.perf_counter() - start}, args.out)


if __name__ == "__main__":
  main()

"""What FoX's forget gates learn in a mechanism-suite cell (docs/mechanisms.md, issue #59): per
layer and head, the gate's timescale on the cell's test sequences at init and every ``--every``
steps of training, and the cell's test accuracy at the end.

Each run trains ``--config mechanisms:TASK-MODEL`` at one seed and rate through
``lpcjax.training.train`` (the same run as train.py's), with a hook that applies the model to a
fixed batch of 32 test-split sequences and reads the gates' log f. Per head it records

* ``timescale``: -1 / mean(log f) over every position of the batch: the number of tokens over
  which the head's weights decay by 1/e, at its average gate;
* ``median_timescale``: the median over positions of -1 / log f, which a few wide-open
  positions cannot dominate;
* ``open_fraction``: the share of positions whose own timescale -1 / log f exceeds the task's
  recall distance (``--reach``, default the training length 128): where the head keeps tokens
  that far back, at least for a step.

A gate with timescale T weights a token d steps back by about exp(-d / T) (against a token
next to the query), so a head that is to fetch an identifier 96 tokens back needs T of that order
at the positions between them. Then eval.py scores the run on 512 test sequences, as the suite
does. The JSON (default benchmarks/results/fox_gates_cpu.json) keeps every run; runs already in
it are skipped. ``--plot`` draws the timescales by head at init and at the end.

  python benchmarks/fox_gates.py --cells delayed_id-fox_pro:3e-3:1 delayed_id-fox_pro:3e-3:2
  python benchmarks/fox_gates.py --plot docs/mechanisms/fox_gate_timescales.png
"""

import argparse
import json
import os

import numpy as np
from results_file import write_results
from run_commands import ROOT

BATCH = 32


def gate_statistics(log_f, reach):
  """log f [batch, seq, heads] -> per head {timescale, median_timescale, open_fraction}."""
  log_f = np.asarray(log_f, np.float64)
  per_position = -1.0 / np.minimum(log_f, -1e-30)
  flat = per_position.reshape(-1, per_position.shape[-1])
  return {"timescale": (-1.0 / np.minimum(log_f.mean(axis=(0, 1)), -1e-30)).tolist(),
          "median_timescale": np.median(flat, axis=0).tolist(),
          "open_fraction": (flat > reach).mean(axis=0).tolist()}


def gate_probe(family, model_config, batch, reach):
  """A function of params giving {layer: gate_statistics} on ``batch``: the ForgetGate modules'
  outputs, captured as Flax intermediates. Intermediates do not leave ``nn.scan`` or ``nn.remat``,
  so the probe applies the same model with its layers unrolled, each layer's params sliced from
  the scanned stack."""
  import dataclasses

  import jax

  from lpcjax.layers import ForgetGate

  model = family.build(dataclasses.replace(model_config, scan_layers=False, remat_policy="none"))
  layers = model_config.num_layers

  def unrolled(params):
    if not model_config.scan_layers:
      return params
    stack = params["layers"]
    return {**params, "layers": {f"block_{i}": jax.tree.map(lambda a, i=i: a[i], stack) for i in range(layers)}}

  def captured(module, method_name):
    return isinstance(module, ForgetGate) and method_name == "__call__"

  @jax.jit
  def log_f_of(params):
    _, state = model.apply({"params": unrolled(params)}, batch["inputs"], segment_ids=batch.get("segment_ids"),
                           capture_intermediates=captured, mutable=["intermediates"])
    return state["intermediates"]

  def probe(params):
    found = {}
    for path, value in jax.tree_util.tree_leaves_with_path(log_f_of(params)):
      layer = next(str(key.key) for key in path if str(getattr(key, "key", "")).startswith("block_"))
      found[layer] = gate_statistics(value, reach)
    return dict(sorted(found.items()))

  return probe


def measure(cell, lr, seed, steps, every, reach, run_dir):
  """Train one cell with the gate probe as a hook; its record (the gates by step and the test
  accuracy)."""
  import jax

  from lpcjax import experiment, models
  from lpcjax.commands import evaluate
  from lpcjax.data import make_dataset
  from lpcjax.training import Hook, train

  name = f"{cell}-s{seed}-lr{lr:g}"
  config = experiment.apply_overrides(
      experiment.load_experiment(f"mechanisms:{cell}", os.path.join(ROOT, "configs")),
      [f"train.seed={seed}", f"train.learning_rate={lr:g}", f"train.steps={steps}",
       f"train.warmup_steps={steps // 10}", f"train.run_dir={run_dir}", f"train.run_name={name}"])
  test = make_dataset(config.data, seed=0, split="test", max_examples=BATCH)
  batch = {key: value[:BATCH] for key, value in test[0].items()}
  probe = gate_probe(models.get(config.model.family), config.model, batch, reach)
  by_step = {}
  record = lambda step, state, _: by_step.__setitem__(str(step), probe(state.params))
  run, summary = train(config, resume="or_start", progress=False,
                       hooks=[Hook(every, record, at_last_step=True, at_start=True)])
  out = os.path.join(run, "eval_x1")
  status = evaluate.main(["--run", run, "--split", "test", "--eval-len", str(config.data.seq_len),
                             "--max-sequences", "512", "--batch-size", "32", "--no-progress", "--out", out])
  if status:
    raise SystemExit(f"eval.py failed on {run}")
  with open(os.path.join(out, "per_token.json")) as f:
    answers = json.load(f)["answers"]
  jax.clear_caches()
  return name, {"cell": cell, "seed": seed, "lr": lr, "steps": summary["step"], "reach": reach,
                "test_accuracy": answers["accuracy"], "by_bucket": answers["by_bucket"], "gates": by_step}


def markdown(runs, steps=("0", "100", "400")):
  """Per run: test accuracy and, per layer, the heads' timescales at the given steps."""
  lines = ["| run | test accuracy | layer | " + " | ".join(f"timescales at step {s}" for s in steps) + " |",
           "|---|---|---|" + "---|" * len(steps)]
  for name, run in sorted(runs.items()):
    for i, layer in enumerate(run["gates"]["0"]):
      cells = [" / ".join(f"{t:.0f}" for t in run["gates"][s][layer]["timescale"]) if s in run["gates"] else "–"
               for s in steps]
      head = f"| {name} | {100 * run['test_accuracy']:.1f}% |" if i == 0 else "| | |"
      lines.append(f"{head} {layer.removeprefix('block_')} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def plot(runs, path, columns=4):
  """Timescale by head (layers side by side) at init and at the end, one panel per run."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  rows = -(-len(runs) // columns)
  fig, axes = plt.subplots(rows, columns, figsize=(3.4 * columns, 3.2 * rows), sharey=True, squeeze=False)
  for ax in axes.flat[len(runs):]:
    ax.axis("off")
  for ax, (name, run) in zip(axes.flat, sorted(runs.items())):
    first, last = min(run["gates"], key=int), max(run["gates"], key=int)
    labels = []
    for step, style, color in ((first, "o:", "tab:blue"), (last, "s-", "tab:orange")):
      x, labels = 0, []
      for i, (layer, stats) in enumerate(run["gates"][step].items()):
        heads = len(stats["timescale"])
        ax.plot(range(x, x + heads), stats["timescale"], style, color=color,
                label=f"step {step}" if i == 0 else None)  # one line per layer: no line across layers
        labels += [f"{layer.removeprefix('block_')}.{h}" for h in range(heads)]
        x += heads
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_yscale("log")
    ax.axhline(run["reach"], color="gray", linestyle=":")
    ax.set_title(f"{name}\ntest {100 * run['test_accuracy']:.1f}%", fontsize=7)
    ax.set_xlabel("layer.head", fontsize=7)
  for row in axes:
    row[0].set_ylabel("timescale -1/mean log f (tokens)", fontsize=7)
  axes[0][0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  print(f"wrote {path}")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--cells", nargs="*", default=[], help="TASK-MODEL:LR:SEED, e.g. delayed_id-fox_pro:3e-3:2")
  parser.add_argument("--steps", type=int, default=400)
  parser.add_argument("--every", type=int, default=100, help="probe the gates every this many steps")
  parser.add_argument("--reach", type=float, default=128.0, help="the recall distance of open_fraction")
  parser.add_argument("--run-dir", default="runs/fox_gates")
  parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "fox_gates_cpu.json"))
  parser.add_argument("--plot", default=None, help="draw the runs in the JSON into this PNG")
  parser.add_argument("--only", nargs="*", default=None, help="with --plot: only these runs")
  args = parser.parse_args()
  os.chdir(ROOT)  # --run-dir is relative to the checkout, as in benchmarks/mechanisms.py
  runs = {}
  if os.path.exists(args.out):
    with open(args.out) as f:
      runs = json.load(f)["runs"]
  for spec in args.cells:
    cell, lr, seed = spec.split(":")
    name = f"{cell}-s{int(seed)}-lr{float(lr):g}"
    if name in runs:
      continue
    name, runs[name] = measure(cell, float(lr), int(seed), args.steps, args.every, args.reach, args.run_dir)
    last = runs[name]["gates"][max(runs[name]["gates"], key=int)]
    print(f"{name}: test {runs[name]['test_accuracy']:.3f}; timescales at the end "
          + "; ".join(f"{layer} " + " ".join(f"{t:.0f}" for t in stats["timescale"]) for layer, stats in last.items()),
          flush=True)
    write_results("fox_gates", {
        "what": "Per FoX cell of the mechanism suite: per layer and head the gate timescale -1/mean(log f), the "
                "median of -1/log f and the share of positions whose -1/log f exceeds reach, on 32 test "
                "sequences, at init and every 100 steps; and the test accuracy (eval.py, 512 sequences).",
        "commands": ["python benchmarks/fox_gates.py --cells TASK-MODEL:LR:SEED ..."], "runs": runs}, args.out)
  print(markdown({k: v for k, v in runs.items() if args.only is None or k in args.only}))
  if args.plot:
    plot({k: v for k, v in runs.items() if args.only is None or k in args.only}, args.plot)


if __name__ == "__main__":
  main()

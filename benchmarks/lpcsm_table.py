"""The LPC-SM table of docs/lpcsm.md: the tiny config's full model, its Stage-A ablations, Stage B
(adaptive and fixed ratio) and the FoX / Transformer baselines at one recipe, over several seeds,
each a train.py run (and the delayed-identifier probe through eval.py where asked), one after
another.

After every run its figures go into the JSON (default benchmarks/results/lpcsm_table_<backend>.json):
held-out LM loss, steps, the per-layer sparse ratio ρ and firing rate on the held-out data at the
end and their training-log trajectories, wall time, and the probe's key CE (cued and control).
Runs already in the JSON are skipped, a run directory that already reached its steps is read
rather than trained again (its wall_s is then None) and a stopped one is continued from its last
checkpoint (--resume-or-start), so an interrupted table resumes where it stopped. Prints the table.

  python -m lpcjax.data runs/data/pg_a BOOKS...    # the data: see DATA below and docs/lpcsm.md
  python benchmarks/lpcsm_table.py [--seeds 0 1] [--rows full no_mhc ...] [--probe full no_mhc]
"""

import argparse
import json
import os
import sys

import jax
from results_file import write_results
from run_commands import ROOT, complete, timed

BOOKS = os.path.join(ROOT, "..", "shared", "data", "pg_books")
DATA = {  # token-file prefix -> books of pg_books (python -m lpcjax.data PREFIX BOOK.txt.gz ...)
    "pg_a": ["anne_of_green_gables", "brothers_karamazov", "count_of_monte_cristo", "crime_and_punishment",
             "great_expectations", "huckleberry_finn", "jane_eyre", "les_miserables", "little_women",
             "middlemarch", "moby_dick", "pride_and_prejudice"],
    "pg_b": ["sherlock_holmes", "tale_of_two_cities", "tom_jones", "ulysses", "war_and_peace"],
    "pg_eval": ["dracula", "frankenstein", "wuthering_heights"],
}
# row -> (label, config, run name at seed 0, train data, steps, extra overrides); in priority order.
ROWS = {
    "full": ("LPC-SM, full", "lpcsm:tiny", "lpcsm_tiny", "pg_a", 200, []),
    "no_mhc": ("− mHC", "lpcsm:tiny_no_mhc", "lpcsm_tiny_no_mhc", "pg_a", 200, []),
    "no_pc": ("− predictive coding", "lpcsm:tiny_no_pc", "lpcsm_tiny_no_pc", "pg_a", 200, []),
    "stage_b": ("Stage B, adaptive ratio", "lpcsm:tiny_stage_b", "lpcsm_tiny_stage_b", "pg_b", 100, []),
    "stage_b_fixed": ("Stage B, fixed ratio", "lpcsm:tiny_stage_b_fixed", "lpcsm_tiny_stage_b_fixed", "pg_b", 100,
                      []),
    "no_slow": ("− slow memory", "lpcsm:tiny_no_slow", "lpcsm_tiny_no_slow", "pg_a", 200, []),
    "no_ont": ("− ONT", "lpcsm:tiny_no_ont", "lpcsm_tiny_no_ont", "pg_a", 200, []),
    "no_stop": ("− stop head", "lpcsm:tiny_no_stop", "lpcsm_tiny_no_stop", "pg_a", 200, []),
    "fox": ("FoX (LLaMA)", "fox_tiny_text", "fox_tiny", "pg_a", 200, ["train.warmup_steps=30"]),
    "transformer": ("Transformer (RoPE)", "fox_tiny_text", "transformer_tiny", "pg_a", 200,
                    ["train.warmup_steps=30", "model.family=transformer"]),
}
PROBE_PROMPTS = 24


def run_name(row, seed):
  return ROWS[row][2] + (f"_s{seed}" if seed else "")


def train_command(row, seed, run_dir, data_dir):
  _, config, _, train_data, steps, extra = ROWS[row]
  command = [sys.executable, "train.py", "--resume-or-start", "--config", config, "data.kind=tokens",
             f"data.train_tokens={data_dir}/{train_data}", f"data.eval_tokens={data_dir}/pg_eval",
             f"train.steps={steps}", "train.eval_batches=32", f"train.seed={seed}",
             f"train.run_dir={run_dir}", f"train.run_name={run_name(row, seed)}", *extra]
  if row.startswith("stage_b"):  # Stage B continues the Stage-A run of the same seed
    command.append(f"train.init_from={run_dir}/{run_name('full', seed)}")
  return command


def probe_command(run):
  haystack = [os.path.join(BOOKS, f"{book}.txt.gz") for book in DATA["pg_eval"]]
  return [sys.executable, "eval.py", "--run", run, "--delayed-id", "--delayed-id-prompts", str(PROBE_PROMPTS),
          "--haystack", *haystack, "--max-sequences", "16", "--eval-len", "256", "--no-progress"]


def read_jsonl(path):
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def per_layer(record, name, prefix=""):
  layers, layer = [], 0
  while f"{prefix}{name}_layer{layer}" in record:
    layers.append(record[f"{prefix}{name}_layer{layer}"])
    layer += 1
  return layers or None


def figures(run):
  """The run's held-out figures (summary.json) and its per-layer ρ / firing-rate trajectories."""
  with open(os.path.join(run, "summary.json")) as f:
    summary = json.load(f)
  logged = [r for r in read_jsonl(os.path.join(run, "metrics.jsonl")) if "loss" in r and "eval_loss" not in r]
  row = {"eval_lm_loss": summary.get("eval_lm_loss", summary.get("eval_loss")), "steps": summary["step"],
         "num_params": summary["num_params"], "train_seconds": summary["train_seconds"],
         "eval_sparse_ratio": summary.get("eval_sparse_ratio"), "eval_fire_rate": summary.get("eval_fire_rate"),
         "per_layer_final": {name: per_layer(summary, name, "eval_") for name in ("sparse_ratio", "fire_rate")}}
  if row["per_layer_final"]["sparse_ratio"]:
    row["trajectory"] = {"step": [r["step"] for r in logged],
                         **{name: [[round(v, 4) for v in per_layer(r, name)] for r in logged]
                            for name in ("sparse_ratio", "fire_rate")}}
  return row


def probe_figures(run):
  with open(os.path.join(run, "eval", "probes.json")) as f:
    probe = json.load(f)["delayed_identifier"]
  return {key: {name: probe[key][name] for name in ("key_ce", "key_ce_std", "key_ce_per_token")}
          for key in ("cued", "control")} | {"prompts": probe["prompts"], "prompt_len": probe["prompt_len"]}


def load(path):
  if os.path.exists(path):
    with open(path) as f:
      return json.load(f)["runs"]
  return {}


def save(path, runs):
  write_results("lpcsm_table", {
      "what": "LPC-SM tiny config (current defaults), its Stage-A ablations, Stage B and the FoX / Transformer "
              "baselines at one recipe (docs/lpcsm.md, Figures). eval_lm_loss: train.py's final held-out "
              "cross-entropy (32 batches x 4 x 256 tokens); per_layer_final: rho and firing rate on the held-out "
              "batches at the end; trajectory: the training log (per-batch means); delayed_id: key CE summed over "
              f"the identifier's tokens, mean over {PROBE_PROMPTS} prompts (control: header names another id); "
              "wall_s: the train.py subprocess (None: the run directory was already complete).",
      "cpu": f"{os.cpu_count()} CPU cores, shared with other jobs", "python": sys.version.split()[0],
      "data": {prefix: books for prefix, books in DATA.items()},
      "seeds": sorted({run["seed"] for run in runs.values()}),
      "commands": ["python -m lpcjax.data runs/data/PREFIX BOOK.txt.gz ...  (for each PREFIX of data)",
                   *["python " + " ".join(train_command(row, 0, "runs", "runs/data")[1:]) for row in ROWS],
                   "seed s > 0: train.seed=s train.run_name=<name>_s<s> (Stage B: init_from the Stage-A run _s<s>)",
                   "python " + " ".join(probe_command("runs/RUN")[1:])],
      "runs": runs}, path)


def table(runs, seeds):
  lines = [f"{'row':26} " + " ".join(f"{'seed ' + str(s):>8}" for s in seeds) + f" {'mean':>8}   key CE (control)"]
  for row, (label, *_) in ROWS.items():
    losses = [runs.get(run_name(row, s), {}).get("eval_lm_loss") for s in seeds]
    if not any(loss is not None for loss in losses):
      continue
    measured = [loss for loss in losses if loss is not None]
    mean = f"{sum(measured) / len(measured):8.3f}" if len(measured) == len(seeds) else f"{'–':>8}"
    probes = [runs.get(run_name(row, s), {}).get("delayed_id") for s in seeds]
    probe = " / ".join(f"{p['cued']['key_ce']:.2f} ({p['control']['key_ce']:.2f})" if p else "–" for p in probes)
    lines.append(f"{label:26} " + " ".join(f"{loss:8.3f}" if loss is not None else f"{'–':>8}" for loss in losses)
                 + f" {mean}   {probe}")
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS), help="in this order")
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
  parser.add_argument("--probe", nargs="*", default=["full", "no_mhc"], help="rows that also get the probe")
  parser.add_argument("--run-dir", default="runs")
  parser.add_argument("--data-dir", default="runs/data", help="where pg_a, pg_b and pg_eval were prepared")
  parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/lpcsm_table_<backend>.json)")
  args = parser.parse_args()
  out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                 f"lpcsm_table_{jax.default_backend()}.json")
  runs = load(out)
  logs = os.path.join(ROOT, args.run_dir, "logs")
  os.makedirs(logs, exist_ok=True)
  for row in args.rows:
    for seed in args.seeds:
      name = run_name(row, seed)
      run = os.path.join(args.run_dir, name)
      if name not in runs:
        wall = None
        if not complete(os.path.join(ROOT, run), ROWS[row][4]):
          print(f"training {name}", flush=True)
          wall = timed(train_command(row, seed, args.run_dir, args.data_dir), os.path.join(logs, f"{name}.log"))
        runs[name] = {"row": row, "seed": seed, **figures(os.path.join(ROOT, run)), "wall_s": wall}
        save(out, runs)
      if row in args.probe and "delayed_id" not in runs[name]:
        print(f"probing {name}", flush=True)
        wall = timed(probe_command(run), os.path.join(logs, f"{name}_probe.log"))
        runs[name]["delayed_id"] = {**probe_figures(os.path.join(ROOT, run)), "wall_s": wall}
        save(out, runs)
  print(table(runs, args.seeds))


if __name__ == "__main__":
  main()

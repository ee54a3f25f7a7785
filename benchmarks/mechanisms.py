"""The mechanism suite of docs/mechanisms.md: generated tasks x models x seeds on CPU, each cell
a train.py run of ``--config mechanisms:TASK-MODEL`` scored by eval.py on the test split.

Per task and model: a learning-rate sweep (configs/mechanisms.py LEARNING_RATES) at seed 0, the
rate with the best accuracy on the eval split (the trainer's held-out batches) chosen, then the
other seeds at that rate; the figures are test-split accuracies at the answers, so neither the
training nor the choice of rate saw them. Tasks marked for length extrapolation are also scored
at 2x and 4x the training length. The ``default`` group is the default job (``python train.py``)
and its baselines at the default job's own rate, every seed. FoX's gate recipes (configs/mechanisms.py
FOX_RECIPES) and the Transformer (Pro) without RoPE take a rate chosen for another model
(``RATE_FROM``) and get a second table: the cells that decide FoX's gate recipe, with a verdict per
cell against the Transformer (Pro) (docs/mechanisms.md, "FoX's gate recipe").

After every run its figures go into the JSON (default benchmarks/results/mechanisms_<backend>.json);
runs already there are skipped and a stopped run continues from its checkpoint, so an
interrupted suite resumes where it stopped. ``--jobs 2`` runs two cells at a time, each in a
worker process that imports JAX once and calls train.py's and eval.py's ``main`` for every run
(the same code as the command lines, without a second of start-up per run). At the end (or
with ``--report`` alone) the tables go into docs/mechanisms.md between their markers and the plots
into docs/mechanisms/.

  python benchmarks/mechanisms.py                       # everything, in priority order
  python benchmarks/mechanisms.py --groups overwrite delayed_id --jobs 2
  python benchmarks/mechanisms.py --report              # tables and plots from the JSON only
  python benchmarks/mechanisms.py --groups delayed_id --models fox_pro_wide   # one gate recipe
"""

import argparse
import contextlib
import dataclasses
import importlib
import json
import multiprocessing
import os
import re
import shutil
import sys
import time
from concurrent import futures

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from results_file import write_results  # noqa: E402
from run_commands import ROOT, complete  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "configs"))
import mechanisms as suite  # noqa: E402  (configs/mechanisms.py: tasks, models, rates, steps)

# group -> (task, models, lengths scored as multiples of the training length); in priority order.
GROUPS = {
    "default": ("default", ["fox_pro", "fox", "transformer_pro", "fox_paper_init", "transformer"], (1,)),
    "overwrite": ("overwrite", ["fox_pro", "transformer_pro", "transformer_pro_nope", *suite.FOX_RECIPES], (1,)),
    # LPC-SM's ablations run on delayed_id_near only: at this gap the full model is near chance, so an
    # ablation of it here would decide nothing.
    "delayed_id": ("delayed_id", ["fox_pro", "lpcsm_full_window", "sith", "sith_delta", "transformer_pro",
                                  "lpcsm", "lpcsm_mean_memory", *suite.FOX_RECIPES, "transformer_pro_nope"], (1,)),
    "delayed_id_near": ("delayed_id_near", ["lpcsm", "sith", "sith_delta", "lpcsm_no_slow", "lpcsm_no_ont",
                                            "lpcsm_mean_memory", "lpcsm_full_window", "transformer_pro", "fox_pro",
                                            "lpcsm_no_pc", "lpcsm_no_mhc", "lpcsm_no_stop", "lpcsm_fixed_ratio",
                                            *suite.FOX_RECIPES, "transformer_pro_nope"], (1,)),
    "delayed_id_repeat": ("delayed_id_repeat", ["sith", "sith_delta", "transformer_pro", "lpcsm"], (1,)),
    "mqar": ("mqar", ["fox_pro", "transformer_pro", "fox", "transformer", "transformer_nope", "lpcsm",
                      *suite.FOX_RECIPES], (1, 2, 4)),
    "noisy_recall": ("noisy_recall", ["fox_pro", "transformer_pro"], (1,)),
    "fuzzy_recall": ("fuzzy_recall", ["fox_pro", "transformer_pro"], (1,)),
    "selective_copy": ("selective_copy", ["fox_pro", "transformer_pro", "sith", "sith_delta", *suite.FOX_RECIPES,
                                          "transformer_pro_nope"], (1,)),
    "mqar_random": ("mqar_random", ["fox_pro", "transformer_pro"], (1,)),
}
# FoX's gate recipes (issue #59) run at the rate the sweep chose for FoX (Pro) on the same task,
# every seed, without a sweep of their own: the grid's CPU budget (a rate sweep is 3 runs per
# cell). A recipe whose best rate differs is at a disadvantage, which docs/mechanisms.md says. The
# Transformer (Pro) without RoPE, the control of fox_pro_rope, likewise takes transformer_pro's rate
# where it has no sweep of its own (overwrite has one).
RATE_FROM = {**{name: "fox_pro" for name in suite.FOX_RECIPES}, "transformer_pro_nope": "transformer_pro"}
# The default job's rows: overrides of `python train.py` (configs/fox_tiny_mqar.py), its own rate.
DEFAULT_ROWS = {
    "fox_pro": [],
    "fox": ["model.block=llama"],
    "fox_paper_init": ["model.block=llama", "model.gate_bias_init=zero"],
    "transformer_pro": ["model.family=transformer"],
    "transformer": ["model.family=transformer", "model.block=llama"],
}
DEFAULT_LR, DEFAULT_STEPS, DEFAULT_LEN = 1e-2, 500, 64
TEST_SEQUENCES = 512
MARKERS = ("<!-- mechanisms-table:start -->", "<!-- mechanisms-table:end -->")
RECIPE_MARKERS = ("<!-- fox-recipes:start -->", "<!-- fox-recipes:end -->")
# The cells that decide FoX's gate recipe (issue #59): (task, test length multiple, role). Recall:
# level with the Transformer (Pro), worst seed against worst seed, within LEVEL; lead: FoX's
# worst seed above the Transformer's best.
RECIPE_CELLS = [("delayed_id", "1", "recall"), ("delayed_id_near", "1", "recall"), ("selective_copy", "1", "recall"),
                ("overwrite", "1", "lead"), ("mqar", "4", "lead")]
LEVEL = 0.01


@dataclasses.dataclass(frozen=True)
class Job:
  task: str
  model: str
  seed: int
  lr: float
  lengths: tuple

  @property
  def name(self):
    return f"{self.task}-{self.model}-s{self.seed}-lr{self.lr:g}"

  @property
  def train_len(self):
    return DEFAULT_LEN if self.task == "default" else suite.SEQ_LEN

  def train_command(self, run_dir, steps):
    if self.task == "default":
      config, extra, steps = [], DEFAULT_ROWS[self.model], DEFAULT_STEPS
    else:
      config, extra = ["--config", f"mechanisms:{self.task}-{self.model}"], [f"train.steps={steps}",
                                                                            f"train.warmup_steps={steps // 10}"]
    return ["train.py", "--resume-or-start", *config, f"train.seed={self.seed}",
            f"train.learning_rate={self.lr:g}", f"train.run_dir={run_dir}", f"train.run_name={self.name}", *extra]

  def eval_command(self, run, multiple):
    return ["eval.py", "--run", run, "--split", "test", "--eval-len", str(multiple * self.train_len),
            "--max-sequences", str(TEST_SEQUENCES), "--batch-size", "32", "--no-progress",
            "--out", os.path.join(run, f"eval_x{multiple}")]


def pairs(groups, models):
  """(task, model, lengths) in priority order: the groups' order, and within a group the order of
  ``models`` when given (else the group's own)."""
  for group in groups:
    task, names, lengths = GROUPS[group]
    for model in (models or names):
      if model in names:
        yield task, model, lengths


def best_rate(runs, task, model, rates):
  """The seed-0 rate with the best eval-split accuracy (ties: lower eval loss); None while the
  sweep is incomplete."""
  swept = [runs.get(Job(task, model, 0, lr, ()).name) for lr in rates]
  if any(run is None for run in swept):
    return None
  score = lambda run: (run["val_accuracy"] if run["val_accuracy"] == run["val_accuracy"] else -1.0,
                       -(run["val_loss"] if run["val_loss"] == run["val_loss"] else float("inf")))
  return max(swept, key=score)["lr"]


def chosen_rate(runs, task, model):
  """The rate of the pair's runs: the default job's own, the best of the pair's own sweep, or,
  for a model of ``RATE_FROM`` without a sweep of its own on the task, the rate chosen for its
  source; None while the sweep that decides is incomplete."""
  if task == "default":
    return DEFAULT_LR
  own = best_rate(runs, task, model, suite.LEARNING_RATES)
  if own is not None or model not in RATE_FROM:
    return own
  return best_rate(runs, task, RATE_FROM[model], suite.LEARNING_RATES)


def jobs_ready(runs, task, model, lengths, seeds):
  """The pair's jobs that can run now: the sweep at seed 0, then the other seeds at its best rate
  (a model of ``RATE_FROM`` without a sweep of its own: every seed at its source's chosen rate,
  once that is known)."""
  if model in RATE_FROM and best_rate(runs, task, model, suite.LEARNING_RATES) is None:
    lr = chosen_rate(runs, task, model)
    return [] if lr is None else [Job(task, model, seed, lr, lengths) for seed in seeds]
  rates = (DEFAULT_LR,) if task == "default" else suite.LEARNING_RATES
  sweep = [Job(task, model, 0, lr, lengths) for lr in rates]
  if task == "default":
    return [Job(task, model, seed, DEFAULT_LR, lengths) for seed in seeds]
  pending = [job for job in sweep if job.name not in runs]
  if pending:
    return pending
  lr = best_rate(runs, task, model, rates)
  return [Job(task, model, seed, lr, lengths) for seed in seeds if seed != 0]


def in_process(command, log_path):
  """Runs ``command`` (["train.py" | "eval.py", args...]) through that script's main() in this
  process, its output into log_path; seconds it took."""
  if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
  os.chdir(ROOT)
  script = importlib.import_module(command[0].removesuffix(".py"))
  start = time.perf_counter()
  with open(log_path, "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
    status = script.main(command[1:])
  import jax
  jax.clear_caches()  # a worker runs many models: keep only what the next one needs
  if status:
    raise RuntimeError(f"exit status {status}: {' '.join(command)} (see {log_path})")
  return time.perf_counter() - start


def same_task_and_model(job, run, run_dir, steps):
  """Whether the run in ``run`` was trained with the model and data the job's command gives now
  (a cell whose config changed since, e.g. a task's gap, must not be reused; the run's own
  config.json is the record). A run without a config.json never started: it is reused."""
  from lpcjax import experiment
  from lpcjax.training.run_directory import read_config
  if not os.path.exists(os.path.join(ROOT, run, "config.json")):
    return True
  command = job.train_command(run_dir, steps)[2:]  # the config and overrides after "--resume-or-start"
  config_name = command[1] if command[:1] == ["--config"] else "fox_tiny_mqar"
  overrides = command[2:] if command[:1] == ["--config"] else command
  wanted = experiment.to_dict(experiment.apply_overrides(
      experiment.load_experiment(config_name, os.path.join(ROOT, "configs")), overrides))
  saved = experiment.to_dict(read_config(os.path.join(ROOT, run)))
  return all(saved[section] == wanted[section] for section in ("model", "data"))


def exit_with_parent(parent):
  """A worker's initializer: the worker exits when the driver is gone (a killed driver's pool
  workers would otherwise train on, unseen, with nobody to record their runs)."""
  import threading

  def watch():
    while os.getppid() == parent:
      time.sleep(5)
    os._exit(1)

  threading.Thread(target=watch, daemon=True).start()


def run_job(job, run_dir, steps, logs):
  """Train (or continue) one run and score it on the test split; its JSON record."""
  run = os.path.join(run_dir, job.name)
  wall = None
  if os.path.isdir(os.path.join(ROOT, run)) and not same_task_and_model(job, run, run_dir, steps):
    shutil.rmtree(os.path.join(ROOT, run))  # a run of an earlier version of the cell: train it anew
  if not complete(os.path.join(ROOT, run), DEFAULT_STEPS if job.task == "default" else steps):
    wall = in_process(job.train_command(run_dir, steps), os.path.join(logs, f"{job.name}.log"))
  with open(os.path.join(ROOT, run, "summary.json")) as f:
    summary = json.load(f)
  record = {"task": job.task, "model": job.model, "seed": job.seed, "lr": job.lr, "steps": summary["step"],
            "val_accuracy": summary.get("eval_accuracy"), "val_loss": summary.get("eval_loss"),
            "num_params": summary.get("num_params"), "train_seconds": summary.get("train_seconds"), "wall_s": wall,
            "test": {}}
  for multiple in job.lengths:
    seconds = in_process(job.eval_command(run, multiple), os.path.join(logs, f"{job.name}_eval_x{multiple}.log"))
    with open(os.path.join(ROOT, run, f"eval_x{multiple}", "per_token.json")) as f:
      answers = json.load(f)["answers"]
    record["test"][str(multiple)] = {**answers, "wall_s": seconds}
  return record


def load(path):
  if os.path.exists(path):
    with open(path) as f:
      return json.load(f)["runs"]
  return {}


def save(path, runs, steps):
  write_results("mechanisms", {
      "what": "The mechanism suite (docs/mechanisms.md): per run, val_accuracy (train.py's held-out eval split, "
              "which picks the rate) and test[multiple] (eval.py --split test at multiple x the training length: "
              f"accuracy at the answers over {TEST_SEQUENCES} sequences, by difficulty bucket, with chance).",
      "cpu": f"{os.cpu_count()} CPU cores, shared with other jobs", "python": sys.version.split()[0],
      "steps": steps, "learning_rates": list(suite.LEARNING_RATES),
      "commands": ["python benchmarks/mechanisms.py", "one run: python train.py --config mechanisms:TASK-MODEL "
                   "train.seed=S train.learning_rate=LR; python eval.py --run RUN --split test --eval-len L"],
      "runs": runs}, path)


# ---------------------------------------------------------------------------------- the report


def cells(runs, seeds):
  """{(task, model): {"lr", "seeds": {seed: run}, "sweep": {lr: val_accuracy}}} at the chosen rate."""
  table = {}
  for group, (task, models, _) in GROUPS.items():
    for model in models:
      rates = (DEFAULT_LR,) if task == "default" else suite.LEARNING_RATES
      lr = chosen_rate(runs, task, model)
      if lr is None:
        continue
      chosen = {seed: runs[Job(task, model, seed, lr, ()).name] for seed in seeds
                if Job(task, model, seed, lr, ()).name in runs}
      if chosen:
        swept = {r: runs.get(Job(task, model, 0, r, ()).name) for r in rates}
        sweep = {f"{r:g}": run and run["val_accuracy"] for r, run in swept.items()}
        table[(task, model)] = {"lr": lr, "seeds": chosen, "sweep": sweep}
  return table


def _test(run, multiple="1"):
  return run["test"][multiple]["accuracy"]


def markdown(table, seeds):
  lines = ["| task | model | lr | test accuracy, mean (min–max) | " + " / ".join(f"s{s}" for s in seeds)
           + " | chance | eval-split accuracy at lr " + " / ".join(f"{r:g}" for r in suite.LEARNING_RATES) + " |",
           "|---|---|---|---|---|---|---|"]
  for (task, model), cell in table.items():
    accuracies = [_test(cell["seeds"][s]) for s in seeds if s in cell["seeds"]]
    per_seed = " / ".join(f"{100 * _test(cell['seeds'][s]):.1f}" if s in cell["seeds"] else "–" for s in seeds)
    mean = f"{100 * sum(accuracies) / len(accuracies):.1f}% ({100 * min(accuracies):.1f}–{100 * max(accuracies):.1f})"
    chance = next(iter(cell["seeds"].values()))["test"]["1"]["chance"]
    sweep = " / ".join(f"{100 * v:.1f}" if v is not None else "–" for v in cell["sweep"].values())
    lines.append(f"| {task} | {model} | {cell['lr']:g} | {mean} | {per_seed} | {100 * chance:.1f}% | {sweep} |")
  extrapolated = [(key, cell) for key, cell in table.items() if "2" in next(iter(cell["seeds"].values()))["test"]]
  if extrapolated:
    lines += ["", "Length extrapolation (trained at L, test accuracy at L / 2L / 4L, mean (min–max) over the seeds):",
              "", "| task | model | seeds | L | 2L | 4L |", "|---|---|---|---|---|---|"]
    for (task, model), cell in extrapolated:
      runs = list(cell["seeds"].values())
      spread = lambda v: f"{100 * sum(v) / len(v):.1f}% ({100 * min(v):.1f}–{100 * max(v):.1f})"
      columns = [spread([_test(r, m) for r in runs]) for m in ("1", "2", "4") if all(m in r["test"] for r in runs)]
      lines.append(f"| {task} | {model} | {len(runs)} | " + " | ".join(columns) + " |")
  return "\n".join(lines)


def plot(table, out_dir):
  """One plot per task: test accuracy by difficulty bucket (mean over seeds), a line per model."""
  os.makedirs(out_dir, exist_ok=True)
  by_task = {}
  for (task, model), cell in table.items():
    by_task.setdefault(task, []).append((model, cell))
  for task, rows in by_task.items():
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for model, cell in rows:
      runs = list(cell["seeds"].values())
      buckets = sorted({int(b) for r in runs for b in r["test"]["1"]["by_bucket"]})
      means = [sum(r["test"]["1"]["by_bucket"].get(str(b), {"accuracy": 0})["accuracy"] for r in runs) / len(runs)
               for b in buckets]
      ax.plot(buckets, means, "o-", label=f"{model} ({len(runs)} seeds)")
    first = rows[0][1]["seeds"][min(rows[0][1]["seeds"])]["test"]["1"]
    ax.axhline(first["chance"], color="gray", linestyle=":", label="chance")
    if max(int(b) for b in first["by_bucket"]) >= 4:
      ax.set_xscale("log", base=2)
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel(first["bucket_name"])
    ax.set_ylabel("test accuracy at the answers")
    ax.set_title(f"{task}: accuracy by {first['bucket_name']}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, f"{task}.png"), dpi=110)
    plt.close(fig)
  extrapolated = [(key, cell) for key, cell in table.items() if "4" in next(iter(cell["seeds"].values()))["test"]]
  if extrapolated:
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for (task, model), cell in extrapolated:
      runs = list(cell["seeds"].values())
      ax.plot([1, 2, 4], [sum(_test(r, m) for r in runs) / len(runs) for m in ("1", "2", "4")], "o-",
              label=f"{task} {model}")
    ax.set_xscale("log", base=2)
    ax.set_xticks([1, 2, 4], ["L", "2L", "4L"])
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("test length (trained at L)")
    ax.set_ylabel("test accuracy at the answers")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "length_extrapolation.png"), dpi=110)
    plt.close(fig)


def recipe_verdict(recipe, baseline, role):
  """Whether a recipe's seeds meet its cell's bar against the Transformer (Pro)'s: "level" for a
  recall cell (worst seed within LEVEL of the Transformer's worst, or above), "lead" (worst
  seed above the Transformer's best)."""
  if role == "recall":
    return "level" if min(recipe) >= min(baseline) - LEVEL else "behind"
  return "lead" if min(recipe) > max(baseline) else "no lead"


def recipe_markdown(runs, seeds):
  """FoX's gate recipes against the Transformer (Pro) on the deciding cells: per cell and model the
  test accuracy per seed at the model's rate, and per recipe whether it meets every bar."""
  models = ["transformer_pro", "fox_pro", *suite.FOX_RECIPES, "transformer_pro_nope"]
  lines = ["| task (test length) | " + " | ".join(models) + " |", "|---|" + "---|" * len(models)]
  meets = {model: True for model in models[1:-1]}  # the last, the Transformer without RoPE, is a control
  for task, multiple, role in RECIPE_CELLS:
    row, baseline = [], None
    for model in models:
      lr = chosen_rate(runs, task, model)
      found = [runs.get(Job(task, model, seed, lr, ()).name) for seed in seeds] if lr else []
      if not found or None in found:
        row.append("–")
        if model in meets:
          meets[model] = False  # not measured: no verdict
        continue
      accuracies = [run["test"][multiple]["accuracy"] for run in found]
      text = " / ".join(f"{100 * a:.1f}" for a in accuracies) + f" (lr {lr:g})"
      if model == "transformer_pro":
        baseline = accuracies
      elif baseline is not None and model in meets:
        verdict = recipe_verdict(accuracies, baseline, role)
        meets[model] = meets[model] and verdict in ("level", "lead")
        text += f" **{verdict}**"
      row.append(text)
    lines.append(f"| {task} ({'L' if multiple == '1' else multiple + 'L'}, {role}) | " + " | ".join(row) + " |")
  lines.append("| every bar met | – | " + " | ".join("**yes**" if meets[m] else "no" for m in meets) + " | – |")
  return "\n".join(lines)


def fill_between(page, markers, text, doc):
  pattern = re.compile(re.escape(markers[0]) + ".*?" + re.escape(markers[1]), re.S)
  if not pattern.search(page):
    raise SystemExit(f"{doc} has no {markers[0]} ... {markers[1]} markers for the table")
  return pattern.sub(lambda _: f"{markers[0]}\n{text}\n{markers[1]}", page)


def write_report(runs, seeds, doc):
  table = cells(runs, seeds)
  text, recipes = markdown(table, seeds), recipe_markdown(runs, seeds)
  print(text + "\n\n" + recipes)
  plot(table, os.path.join(os.path.dirname(doc), "mechanisms"))
  with open(doc) as f:
    page = f.read()
  page = fill_between(fill_between(page, MARKERS, text, doc), RECIPE_MARKERS, recipes, doc)
  with open(doc, "w") as f:
    f.write(page)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--groups", nargs="+", default=list(GROUPS), choices=list(GROUPS), help="in this order")
  parser.add_argument("--models", nargs="+", default=None, help="only these models of the groups, in this order")
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--steps", type=int, default=suite.STEPS)
  parser.add_argument("--jobs", type=int, default=1, help="runs at a time")
  parser.add_argument("--run-dir", default="runs/mechanisms")
  parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/mechanisms_<backend>.json)")
  parser.add_argument("--doc", default=os.path.join(ROOT, "docs", "mechanisms.md"))
  parser.add_argument("--report", action="store_true", help="only write the table and plots from the JSON")
  args = parser.parse_args()
  import jax
  out = args.out or os.path.join(ROOT, "benchmarks", "results", f"mechanisms_{jax.default_backend()}.json")
  runs = load(out)
  if not args.report:
    logs = os.path.join(ROOT, args.run_dir, "logs")
    os.makedirs(logs, exist_ok=True)
    running = {}
    # Fresh interpreters (spawn), not forks of this one: JAX is not fork-safe.
    with futures.ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn"),
                                     initializer=exit_with_parent, initargs=(os.getpid(),)) as pool:
      while True:
        for task, model, lengths in pairs(args.groups, args.models):
          for job in jobs_ready(runs, task, model, lengths, args.seeds):
            if len(running) < args.jobs and job.name not in runs and job.name not in running.values():
              print(f"running {job.name}", flush=True)
              running[pool.submit(run_job, job, args.run_dir, args.steps, logs)] = job.name
        if not running:
          break
        done, _ = futures.wait(running, return_when=futures.FIRST_COMPLETED)
        for future in done:
          name = running.pop(future)
          runs[name] = future.result()
          test = runs[name]["test"]["1"]
          print(f"  {name}: val {runs[name]['val_accuracy']:.3f}, test {test['accuracy']:.3f} "
                f"(chance {test['chance']:.3f}), {runs[name]['wall_s'] or 0:.0f} s", flush=True)
          save(out, runs, args.steps)
  write_report(runs, args.seeds, args.doc)


if __name__ == "__main__":
  main()

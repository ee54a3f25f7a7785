"""Does PMT pre-training beat its controls? Pre-trains ``configs/pmt.py`` variants on UCR sets (or
the generated ``synthetic`` set) over several seeds through the commands users run (train.py,
eval.py), then prints one table:
the linear probe at each label fraction for the raw-series controls (same probe, 1-NN), the
random init, and each pre-trained variant (mean ± std over pre-training seeds of the means
over label seeds), parameter counts, cue-retention AUC by gap, gate values and time per run.

  python benchmarks/pmt_pretraining.py --sets ECG200 GunPoint --seeds 0 1 --steps 150
  python benchmarks/pmt_pretraining.py --validation ...   # the TRAIN files only (30 % held out)
  python benchmarks/pmt_pretraining.py --sets synthetic --variants pmt_cue pmt_cue_no_pcl full_cue \
      --random-init-all --seeds 0 1 --probes cue         # the cue-retention claim (docs/pmt_results.md)
  python benchmarks/pmt_pretraining.py --sets Wafer ECG5000 --controls-only --minirocket   # no training

``--minirocket`` adds the MiniRocket + ridge control (the ``[rocket]`` extra) to the raw-series
rows; ``--controls-only`` computes only the rows that read the series alone (raw-series probe,
1-NN, MiniRocket), in this process, with no pre-training.

``--validation`` evaluates on a held-out 30 % of each TRAIN file, never the TEST file (for
choosing settings); otherwise on the TEST file where the set has one (Wafer's copy has none:
its held-out split). The set ``synthetic`` is the ``synthetic_series`` kind (``pmt:synthetic_*``
configs, no files), scored on its test split (``--validation``: its eval split). Runs go to
--run-dir and are reused when their results exist (--fresh to redo); a cell stopped part-way
continues from its last checkpoint when the command runs again. The --out file accumulates: the
cells it already holds, measured with the same settings (steps, overrides, probes, label seeds,
gaps, controls), are reused and kept in the new table, so a grid can be filled in parts on machines
that no longer have the run directories (``--seeds 2`` adds seed 2 to a file of seeds 0 and 1;
``commands`` lists every command that filled it; ``--fresh`` redoes every cell and replaces the
file). ``--extra`` adds overrides to every training run (e.g. a view to try, or
``train.checkpoint_every=100`` for long runs).
"""

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from results_file import write_results

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UCR = os.path.join(os.path.dirname(REPO), "shared", "data", "ucr")
SYNTHETIC = "synthetic"
# Variant -> the configs/pmt.py variant suffix; the config is pmt:tiny_SUFFIX (UCR sets) or pmt:synthetic_SUFFIX.
VARIANTS = {"pmt": "", "pmt_no_pcl": "no_pcl", "full_matched": "full_matched", "full": "full",
            "pmt_cue": "cue", "pmt_cue_no_pcl": "cue_no_pcl", "full_cue": "cue_full",
            "full_matched_cue": "cue_full_matched"}
# λ_PCL = 0 changes the loss, not the parameters: its random init is PMT's (same seed), so it has no
# random-init control of its own.
SAME_INIT = {"pmt_no_pcl": "pmt", "pmt_cue_no_pcl": "pmt_cue"}
FRACTIONS = (0.01, 0.05, 1.0)  # eval.py's default label fractions


def config_name(name, variant):
  size = SYNTHETIC if name == SYNTHETIC else "tiny"
  return f"pmt:{size}_{VARIANTS[variant]}" if VARIANTS[variant] else f"pmt:{size}"


def files(name, args):
  if name == SYNTHETIC:
    return None, None
  train = os.path.join(args.ucr_dir, name, f"{name}_TRAIN.tsv.gz")
  test = os.path.join(args.ucr_dir, name, f"{name}_TEST.tsv.gz")
  if not os.path.exists(train):
    raise SystemExit(f"{train}: no such file (--ucr-dir {args.ucr_dir} has no set {name})")
  return train, (None if args.validation or not os.path.exists(test) else test)


def run_path(args, name, variant, seed):
  return os.path.join(args.run_dir, f"{name}-{variant}-s{seed}")


def run_one(args, name, variant, seed):
  """Train and evaluate one (set, variant, seed); returns its eval result with the run's time."""
  run = run_path(args, name, variant, seed)
  out = os.path.join(run, "eval")
  if os.path.exists(os.path.join(run, "timing.json")) and not args.fresh:
    return _load(run, out)
  if args.fresh and os.path.exists(run):  # redo: not a resume of the old run
    shutil.rmtree(run)
  train, test = files(name, args)
  overrides = [f"train.steps={args.steps}", f"train.seed={seed}", f"train.run_dir={args.run_dir}",
               f"train.run_name={os.path.basename(run)}", *args.extra]
  if train:
    overrides.append(f"data.train_file={train}")
  if test:
    overrides.append(f"data.eval_file={test}")
  python = sys.executable
  start = time.perf_counter()
  # --resume-or-start: a cell stopped part-way (a signal saves a checkpoint) continues when the same
  # command runs again; with train.checkpoint_every in --extra, a crash loses at most that many steps.
  train_cpu = _run([python, "train.py", "--resume-or-start", "--config", config_name(name, variant), *overrides])
  trained = time.perf_counter()
  # Controls once per set and seed: the raw series with the first variant, the random init with
  # PMT (with every variant but λ_PCL = 0 under --random-init-all).
  controls = raw_control_names(args) if variant == args.variants[0] else []
  if variant == "pmt" or (args.random_init_all and variant not in SAME_INIT):
    controls.append("random")
  probes = args.probes or ("linear,cue" if variant != "full" else "linear")
  split = ["--split", "test"] if name == SYNTHETIC and not args.validation else []
  eval_cpu = _run([python, "eval.py", "--run", run, "--out", out, "--seeds", str(args.label_seeds), "--gaps",
                   args.gaps, "--controls", ",".join(controls) or "none", "--probes", probes, *split])
  timing = {"train_seconds": trained - start, "eval_seconds": time.perf_counter() - trained,
            "train_cpu_seconds": train_cpu, "eval_cpu_seconds": eval_cpu}
  json.dump(timing, open(os.path.join(run, "timing.json"), "w"))
  return _load(run, out)


def raw_control_names(args):
  return ["raw", "1nn"] + (["minirocket"] if args.minirocket else [])


def controls_only(args):
  """{set: {row: cell}} of the controls that need no encoder, computed here from the same
  splits eval.py reads (pmt:tiny's data section: the TEST file, or the held-out 30 %)."""
  from lpcjax import data, experiment
  from lpcjax.evaluation.series import raw_controls
  options = argparse.Namespace(controls=raw_control_names(args), fractions=FRACTIONS, seeds=args.label_seeds,
                               classifier="svm", features="cls")
  out = {}
  for name in args.sets:
    train, test = files(name, args)
    overrides = [f"data.train_file={train}"] + ([f"data.eval_file={test}"] if test else [])
    config = experiment.apply_overrides(experiment.load_experiment("configs/pmt.py:tiny"), overrides)
    splits = {split: data.make_source(config.data, 0, split) for split in ("train", "eval")}
    start = time.perf_counter()
    out[name] = {"train_series": len(splits["train"]), "eval_series": len(splits["eval"]),
                 "eval_split": "TEST file" if test else "held-out 30 % of TRAIN",
                 "rows": raw_controls(splits, options), "seconds": time.perf_counter() - start}
    print(f"\n{name} ({out[name]['train_series']} training / {out[name]['eval_series']} {out[name]['eval_split']}; "
          f"{out[name]['seconds']:.0f} s): accuracy, mean ± std over label seeds")
    for row, cells in out[name]["rows"].items():
      print(f"  {row:<34}" + "".join(
          f"{float(f):>6.0%} {c['accuracy']:.3f} ± {c['accuracy_std']:.3f}" + (" (= smaller)" if "same_as" in c else "")
          for f, c in cells["linear"]["fractions"].items()), flush=True)
  return out


def _run(command):
  """Run a command in the checkout (stdout dropped); its CPU seconds (user + system): what it cost a
  shared machine, whatever else runs (os.wait4 gives this child's own, also with --jobs > 1)."""
  process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL)
  _, status, usage = os.wait4(process.pid, 0)
  if os.waitstatus_to_exitcode(status):
    raise subprocess.CalledProcessError(os.waitstatus_to_exitcode(status), command)
  return usage.ru_utime + usage.ru_stime


def _load(run, out):
  return json.load(open(os.path.join(run, "timing.json"))) | json.load(open(os.path.join(out, "series_probes.json")))[0]


def rows_of(result, variant):
  """{row label: {"linear": ..., "cue": ...}}: the variant's own row and, for pmt, its controls."""
  rows = {variant: {k: result[k] for k in ("linear", "cue") if k in result}}
  for label, row in result.get("controls", {}).items():
    rows[f"{variant}, random init" if "random init" in label else label] = row
  return rows


def mean_std(values):
  values = [v for v in values if v is not None]
  return (float(np.mean(values)), float(np.std(values))) if values else (None, None)


def summarize(results):
  """{set: {row: {"fractions": {f: accuracy and macro-F1 (mean, std, per seed), labels, same_as}, "cue": {g: AUC
  (mean, std, per seed)}}}} over the pre-training seeds."""
  table = {}
  for (name, variant, seed), result in sorted(results.items(), key=lambda item: item[0][2]):
    for row, cells in rows_of(result, variant).items():
      entry = table.setdefault(name, {}).setdefault(row, {"fractions": {}, "cue": {}, "runs": {}})
      entry["runs"].setdefault(seed, cells)  # a raw-series row once per seed, whichever variant carried it
  for rows in table.values():
    for entry in rows.values():
      runs = entry.pop("runs")
      probed = {seed: r for seed, r in runs.items() if "linear" in r}  # --probes cue leaves no linear cells
      fractions = next(iter(probed.values()))["linear"]["fractions"] if probed else {}
      for f, cell in fractions.items():
        per_seed = [r["linear"]["fractions"][f]["accuracy"] for r in probed.values()]
        # Macro-F1 beside accuracy: on an unbalanced set (Earthquakes: 75 % of TEST one class) a
        # probe that predicts the larger class scores high accuracy and a macro-F1 near 0.43.
        f1_per_seed = [r["linear"]["fractions"][f].get("macro_f1") for r in probed.values()]
        acc, f1 = mean_std(per_seed), mean_std(f1_per_seed)
        entry["fractions"][f] = {"accuracy": acc[0], "accuracy_std_over_seeds": acc[1], "labels": cell["labels"],
                                 "same_as": cell.get("same_as"), "pretraining_seeds": len(probed),
                                 "seeds": list(probed), "per_seed": per_seed, "macro_f1": f1[0],
                                 "macro_f1_std_over_seeds": f1[1], "macro_f1_per_seed": f1_per_seed}
      for g in next(iter(runs.values())).get("cue", {}):
        per_seed = [r["cue"].get(g, {}).get("auc") for r in runs.values()]
        auc = mean_std(per_seed)
        entry["cue"][g] = {"auc": auc[0], "auc_std_over_seeds": auc[1], "seeds": list(runs), "per_seed": per_seed}
  return table


def print_table(table, results, fractions):
  for name, rows in table.items():
    params = {variant: r["num_params"] for (n, variant, _), r in results.items() if n == name}
    print(f"\n{name}: probe accuracy (mean ± std over pre-training seeds); parameters {params}")
    header = "".join(f"{float(f):>16.0%}" for f in fractions)
    gaps = sorted({g for row in rows.values() for g in row["cue"]}, key=float)
    print(f"{'row':<28}{header}" + "".join(f"{'cue g=' + format(float(g), 'g'):>14}" for g in gaps))
    for row, entry in rows.items():
      cells = []
      for f in fractions:
        cell = entry["fractions"].get(str(float(f)))
        if cell is None or cell["accuracy"] is None:
          cells.append(f"{'—':>16}")
        elif cell["same_as"]:
          cells.append(f"{'= ' + format(float(cell['same_as']), '.0%'):>16}")
        else:
          cells.append(f"{cell['accuracy']:>9.3f} ± {cell['accuracy_std_over_seeds']:.3f}")
      cues = [f"{entry['cue'][g]['auc']:>8.3f} ± {entry['cue'][g]['auc_std_over_seeds']:.2f}" if g in entry["cue"]
              else f"{'—':>14}" for g in gaps]
      print(f"{row:<28}" + "".join(cells) + "".join(cues))
    # Each pre-training seed's value: the seed overlap that docs/pmt_results.md's verdicts read.
    listed = lambda values: " / ".join(f"{a:.3f}" if a is not None else "–" for a in values)
    for row, entry in rows.items():
      linear, f1 = ({f"{float(f):.0%}": c[key] for f, c in entry["fractions"].items()
                     if len(set(c["per_seed"])) > 1 and not c["same_as"] and None not in c.get(key, [None])}
                    for key in ("per_seed", "macro_f1_per_seed"))  # the raw-series rows repeat one value
      cue = {f"g={float(g):g}": entry["cue"][g]["per_seed"] for g in gaps if g in entry["cue"]}
      for what, values in (("probe accuracy", linear), ("probe macro-F1", f1), ("cue AUC", cue)):
        if values:
          print(f"  {what} per pre-training seed, {row}: " + "; ".join(f"{k} {listed(v)}" for k, v in values.items()))
    for (n, variant, seed), r in results.items():
      if n == name and r["gates"]:
        print(f"  gates after training, {variant} seed {seed}: " + "; ".join(
            f"{block} " + " ".join(f"{k} {v:.3f}" for k, v in gates.items()) for block, gates in r["gates"].items()))


# The arguments that decide what a cell measures: cells stored under other values are not reused.
CELL_SETTINGS = ("steps", "label_seeds", "gaps", "probes", "random_init_all", "validation", "extra", "minirocket")


def cell_settings(args):
  return {k: getattr(args, k) for k in CELL_SETTINGS}


def stored_cells(parser, args):
  """({(set, variant, seed): result}, [commands]) of the --out file, if it was written with the same
  settings (``--fresh``: none; the file is replaced); other settings are a one-line error."""
  if args.fresh or not args.out or not os.path.exists(args.out):
    return {}, []
  stored = json.load(open(args.out))
  if "runs" not in stored:
    raise SystemExit(f"{args.out}: not a pmt_pretraining result file (no 'runs'); pass another --out")
  settings = stored.get("settings")
  if settings is None:  # written before the settings were stored: read its own command line
    try:
      settings = cell_settings(parser.parse_args(shlex.split(stored["command"])[1:]))
    except (SystemExit, ValueError):
      raise SystemExit(f"{args.out}: its command line ({stored['command']!r}) no longer parses; pass another --out")
  as_stored = lambda values: json.loads(json.dumps(values))  # as a JSON file holds them (tuples -> lists)
  settings, now = as_stored(settings), as_stored(cell_settings(args))
  differ = [f"--{k.replace('_', '-')} {settings.get(k)} (now {now[k]})" for k in CELL_SETTINGS
            if settings.get(k) != now[k]]
  if differ:
    raise SystemExit(f"{args.out} holds cells measured with other settings: {'; '.join(differ)}; pass another --out")
  cells = {(r["set"], r["variant"], r["seed"]): result for r, result in zip(stored["runs"], stored["results"])}
  return cells, stored.get("commands", [stored["command"]])


def build_parser():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sets", nargs="+", default=["ECG200", "GunPoint", "Strawberry", "Wafer"])
  parser.add_argument("--variants", nargs="+", default=["pmt", "pmt_no_pcl", "full_matched"], choices=list(VARIANTS))
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="pre-training seeds")
  parser.add_argument("--steps", type=int, default=150)
  parser.add_argument("--label-seeds", type=int, default=5, help="label subsets (and cue placements) per cell")
  parser.add_argument("--gaps", default="0,1,2", help="cue gaps in whole windows")
  parser.add_argument("--probes", default=None,
                      help="eval.py --probes for every run (default linear,cue; linear only for 'full')")
  parser.add_argument("--random-init-all", action="store_true",
                      help="a random-init control beside every variant (but λ_PCL = 0: PMT's init), not only pmt")
  parser.add_argument("--validation", action="store_true", help="held-out 30 %% of TRAIN, never TEST")
  parser.add_argument("--extra", nargs="*", default=[], help="overrides for every training run")
  parser.add_argument("--run-dir", default="runs/pmt_pretraining")
  parser.add_argument("--ucr-dir", default=UCR,
                      help="the folder of the UCR sets, one folder per set holding NAME_TRAIN.tsv.gz "
                           "(and NAME_TEST.tsv.gz); default ../shared/data/ucr beside the checkout")
  parser.add_argument("--fresh", action="store_true")
  parser.add_argument("--jobs", type=int, default=1, help="cells run at once (each a train.py, then an eval.py)")
  parser.add_argument("--cached-only", action="store_true",
                      help="only the runs already in --run-dir (the table of an interrupted measurement)")
  parser.add_argument("--out", default=None,
                      help="JSON path (default benchmarks/results/pmt_pretraining_<backend>.json)")
  parser.add_argument("--minirocket", action="store_true",
                      help="the MiniRocket + ridge control beside the raw-series rows (needs the [rocket] extra)")
  parser.add_argument("--controls-only", action="store_true",
                      help="only the rows that need no encoder (raw probe, 1-NN, MiniRocket): no training")
  return parser


def main(argv=None):
  parser = build_parser()
  args = parser.parse_args(argv)
  command = " ".join(map(shlex.quote, [sys.argv[0], *(sys.argv[1:] if argv is None else argv)]))
  if args.controls_only:
    write_results("pmt_controls", {"command": command, "validation": args.validation,
                                   "label_seeds": args.label_seeds, "sets": controls_only(args)}, args.out)
    return

  stored, commands = stored_cells(parser, args)
  cells, reused = [], []
  for seed in args.seeds:  # seed by seed: an interrupted measurement still has whole seeds
    for name in args.sets:
      for variant in args.variants:
        run = run_path(args, name, variant, seed)
        if (name, variant, seed) in stored:
          reused.append((name, variant, seed))
          continue
        if args.cached_only and not os.path.exists(os.path.join(run, "timing.json")):
          print(f"{name} {variant} seed {seed}: not run (--cached-only)")
          continue
        cells.append((name, variant, seed))

  def one(cell):
    r = run_one(args, *cell)
    if r["step"] != args.steps:  # a run directory trained to another length
      raise SystemExit(f"{run_path(args, *cell)} was trained for {r['step']} steps, not --steps {args.steps}: "
                       "pass another --run-dir, or --fresh")
    print(f"{' '.join(map(str, cell))}: train {r['train_seconds']:.0f} s, eval {r['eval_seconds']:.0f} s", flush=True)
    return r

  with ThreadPoolExecutor(args.jobs) as pool:  # each cell is its own train.py and eval.py processes
    results = stored | dict(zip(cells, pool.map(one, cells)))
  if reused:
    print(f"reused from {args.out}: " + ", ".join(" ".join(map(str, c)) for c in reused))
  table = summarize(results)
  fractions = sorted({float(f) for rows in table.values() for row in rows.values() for f in row["fractions"]})
  print_table(table, results, fractions)
  runs = [{"set": name, "variant": variant, "seed": seed, "config": config_name(name, variant),
           "num_params": r["num_params"], "gates": r["gates"], "train_seconds": r["train_seconds"],
           "eval_seconds": r["eval_seconds"], "train_cpu_seconds": r.get("train_cpu_seconds"),
           "eval_cpu_seconds": r.get("eval_cpu_seconds"), "step": r["step"],
           "train_series": r["train_series"], "eval_series": r["eval_series"]}
          for (name, variant, seed), r in results.items()]
  write_results("pmt_pretraining", {"command": command, "commands": [*commands, command],
                                    "settings": cell_settings(args), "steps": args.steps, "extra": args.extra,
                                    "validation": args.validation, "table": table, "runs": runs,
                                    "results": [r for r in results.values()]}, args.out)


if __name__ == "__main__":
  main()

"""A single-device training run: data, state, steps, progress, metrics and a run directory.

Run directory layout: config.json (the resolved config: enough to rebuild the model),
metrics.jsonl (one JSON object per logged step and per evaluation), summary.json (final
evaluation), checkpoints/<step>/ (Orbax).
"""

import json
import os
import time

import jax
import numpy as np
from tqdm.auto import tqdm

from lpcjax import config as config_lib
from lpcjax import models
from lpcjax.data import make_batches

from .checkpoint import save_state
from .steps import create_train_state, jit_steps


def make_run_dir(config):
  name = config.train.run_name or f"{config.name}-{time.strftime('%Y%m%d-%H%M%S')}"
  run_dir = os.path.join(config.train.run_dir, name)
  if os.path.exists(os.path.join(run_dir, "checkpoints")):
    raise FileExistsError(f"run directory {run_dir} already holds checkpoints; choose another train.run_name")
  os.makedirs(run_dir, exist_ok=True)
  return run_dir


def write_json_atomic(path, obj):
  tmp = f"{path}.tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2, sort_keys=True)
  os.replace(tmp, path)


def evaluate(params, apply_fn, eval_fn, batches, num_batches):
  """Mean masked loss and accuracy over ``num_batches`` eval batches (sums accumulated in float64)."""
  totals = {"loss_sum": 0.0, "hits": 0.0, "count": 0.0}
  for step in range(num_batches):
    out = eval_fn(params, apply_fn, batches.batch(step))
    for key in totals:
      totals[key] += float(out[key])
  count = max(totals["count"], 1.0)
  return {"eval_loss": totals["loss_sum"] / count, "eval_accuracy": totals["hits"] / count,
          "eval_tokens": int(totals["count"])}


def train(config, progress=True):
  """Train ``config`` (an ExperimentConfig); returns (run_dir, summary dict)."""
  family = models.get(config.model.family)
  model = family.build(config.model)
  train_batches = make_batches(config.data, config.train.seed, "train")
  eval_batches = make_batches(config.data, config.train.seed, "eval")
  run_dir = make_run_dir(config)
  write_json_atomic(os.path.join(run_dir, "config.json"), config_lib.to_dict(config))

  state = create_train_state(model, config)
  num_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))
  train_fn, eval_fn = jit_steps(config.model.debug_checks)
  tokens_per_step = config.data.batch_size * config.data.seq_len

  bar = tqdm(range(config.train.steps), desc=config.name, disable=not progress, dynamic_ncols=True)
  with open(os.path.join(run_dir, "metrics.jsonl"), "w") as log:
    start = time.perf_counter()
    for step in bar:
      state, metrics = train_fn(state, train_batches.batch(step))
      done = step + 1
      if done % config.train.log_every == 0 or done == config.train.steps:
        metrics = {k: float(v) for k, v in metrics.items()}
        elapsed = time.perf_counter() - start
        record = {"step": done, **metrics, "tokens_per_sec": done * tokens_per_step / elapsed}
        log.write(json.dumps(record) + "\n")
        log.flush()
        bar.set_postfix(loss=f"{metrics['loss']:.3f}", acc=f"{metrics['accuracy']:.3f}",
                        tok_s=f"{record['tokens_per_sec']:.0f}")
      if config.train.eval_every and done % config.train.eval_every == 0 and done < config.train.steps:
        record = {"step": done, **evaluate(state.params, state.apply_fn, eval_fn, eval_batches,
                                           config.train.eval_batches)}
        log.write(json.dumps(record) + "\n")
    final = {"step": config.train.steps, **evaluate(state.params, state.apply_fn, eval_fn, eval_batches,
                                                    config.train.eval_batches)}
    log.write(json.dumps(final) + "\n")

  save_state(run_dir, config.train.steps, state)
  summary = {**final, "num_params": num_params, "train_seconds": time.perf_counter() - start,
             "family": config.model.family, "name": config.name}
  write_json_atomic(os.path.join(run_dir, "summary.json"), summary)
  return run_dir, summary

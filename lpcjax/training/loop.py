"""The training run: mesh, sharded state, Grain data, Orbax checkpoints, preemption, metrics.

Run directory: config.json (the resolved config: enough to rebuild the model), metrics.jsonl
(one JSON object per logged step and per evaluation), summary.json, checkpoints/<step>/ (Orbax:
state + data iterator). The checkpoint step counts batches consumed, so a resumed run reads
exactly the batches the uninterrupted run would have read.

On SIGTERM or SIGINT the current step finishes, a checkpoint is saved and ``train`` returns
normally (exit 0: the scheduler may restart the job with --resume). A non-finite loss or
gradient skips the update; after ``train.max_nonfinite_steps`` of them in a row the run stops
with an error and saves nothing, so the last good checkpoint stays the latest.
"""

import contextlib
import functools
import json
import os
import signal
import threading
import time

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import checkify
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tqdm.auto import tqdm

from lpcjax import config as config_lib
from lpcjax import models
from lpcjax.data import make_dataset, make_iterator
from lpcjax.files import write_json_atomic
from lpcjax.sharding import make_mesh, rules_from_config

from .checkpoint import Checkpointer, has_checkpoint
from .steps import create_train_state, eval_step, make_optimizer, state_shardings, train_step


class TrainingError(RuntimeError):
  """The run cannot continue (e.g. too many non-finite steps in a row)."""


class NonfiniteGuard:
  """Counts non-finite steps in a row and stops the run at ``limit``. Each step's flag is read
  one step late, after the next step is dispatched, so the host never waits for the device."""

  def __init__(self, limit, on_stop):
    self.limit, self.on_stop, self.run, self.pending = limit, on_stop, 0, None

  def push(self, step, finite):
    previous, self.pending = self.pending, (step, finite)
    if previous is not None:
      self._check(*previous)

  def flush(self):
    if self.pending is not None:
      self._check(*self.pending)
      self.pending = None

  def _check(self, step, finite):
    self.run = 0 if float(finite) else self.run + 1
    if self.run >= self.limit:
      latest = self.on_stop()
      raise TrainingError(f"{self.run} non-finite losses in a row at step {step}; stopped without "
                          f"saving (latest checkpoint: step {latest})")


def run_directory(config, resume):
  name = config.train.run_name or f"{config.name}-{time.strftime('%Y%m%d-%H%M%S')}"
  run_dir = os.path.join(config.train.run_dir, name)
  if has_checkpoint(run_dir) and not resume:
    raise FileExistsError(f"run directory {run_dir} already holds checkpoints; pass --resume to "
                          "continue it or choose another train.run_name")
  os.makedirs(run_dir, exist_ok=True)
  return run_dir


def check_resumable(run_dir, config):
  """The model and data of a resumed run must be the checkpoint's; train.* may change."""
  with open(os.path.join(run_dir, "config.json")) as f:
    saved = json.load(f)
  now = config_lib.to_dict(config)
  for section in ("model", "data"):
    for key in sorted(set(saved[section]) | set(now[section])):
      old, new = saved[section].get(key), now[section].get(key)
      if (list(old) if isinstance(old, (list, tuple)) else old) != (list(new) if isinstance(new, (list, tuple)) else new):
        raise config_lib.ConfigError(f"{section}.{key}: the checkpoint in {run_dir} was trained with "
                                     f"{old!r}, this config says {new!r}")


@contextlib.contextmanager
def stop_requests():
  """Yields a dict whose "stop" turns True on SIGTERM/SIGINT (handlers restored on exit)."""
  flag = {"stop": False}
  if threading.current_thread() is not threading.main_thread():
    yield flag
    return

  def handler(signum, frame):
    flag["stop"] = True

  previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
  try:
    yield flag
  finally:
    for sig, old in previous.items():
      signal.signal(sig, old)


class MetricsLog:
  """metrics.jsonl in the run directory (appended on resume), plus TensorBoard if asked for.
  Only process 0 writes."""

  def __init__(self, run_dir, tensorboard):
    self.enabled = jax.process_index() == 0
    self.file = open(os.path.join(run_dir, "metrics.jsonl"), "a") if self.enabled else None
    self.tensorboard = None
    if tensorboard and self.enabled:
      try:
        from tensorboardX import SummaryWriter
      except ImportError:
        raise config_lib.ConfigError("train.tensorboard: needs tensorboardX "
                                     "(pip install 'lpcjax[tensorboard]')") from None
      self.tensorboard = SummaryWriter(os.path.join(run_dir, "tensorboard"))

  def write(self, record):
    if not self.enabled:
      return
    self.file.write(json.dumps(record) + "\n")
    self.file.flush()
    if self.tensorboard is not None:
      for key, value in record.items():
        if key != "step":
          self.tensorboard.add_scalar(key, value, record["step"])

  def close(self):
    if self.file is not None:
      self.file.close()
    if self.tensorboard is not None:
      self.tensorboard.close()


def jit_steps(family, config, shardings):
  """(train_step, eval_step), compiled; with model.debug_checks the checkify value checks of the
  model raise on the host after the step that failed them."""
  step = functools.partial(train_step, loss_fn=family.loss, accum_steps=config.train.grad_accum_steps)
  evaluate_batch = functools.partial(eval_step, loss_fn=family.loss)
  if not getattr(config.model, "debug_checks", False):
    return (jax.jit(step, donate_argnums=0, out_shardings=(shardings, None)),
            jax.jit(evaluate_batch, static_argnums=1))

  checked_step = jax.jit(checkify.checkify(step, errors=checkify.user_checks))
  checked_eval = jax.jit(checkify.checkify(evaluate_batch, errors=checkify.user_checks), static_argnums=1)

  def run_checked(fn, *args):
    err, out = fn(*args)
    err.throw()
    return out

  return functools.partial(run_checked, checked_step), functools.partial(run_checked, checked_eval)


def evaluate(params, apply_fn, eval_fn, dataset, num_batches, place):
  """Mean masked loss and accuracy over the first ``num_batches`` eval batches (float64 sums)."""
  totals = {"loss_sum": 0.0, "hits": 0.0, "count": 0.0}
  for _, batch in zip(range(num_batches), make_iterator(dataset)):
    out = eval_fn(params, apply_fn, place(batch))
    for key in totals:
      totals[key] += float(out[key])
  count = max(totals["count"], 1.0)
  return {"eval_loss": totals["loss_sum"] / count, "eval_accuracy": totals["hits"] / count,
          "eval_tokens": int(totals["count"])}


def train(config, resume=False, progress=True, devices=None):
  """Train ``config`` (an ExperimentConfig); returns (run_dir, summary dict)."""
  family = models.get(config.model.family)
  model = family.build(config.model)
  mesh = make_mesh(config.train, devices)
  data_ways = mesh.shape["data"] * mesh.shape["fsdp"]
  if config.data.batch_size % (data_ways * config.train.grad_accum_steps):
    raise config_lib.ConfigError(
        f"data.batch_size: {config.data.batch_size} is not divisible by the data axes (data x fsdp "
        f"= {data_ways}) times train.grad_accum_steps={config.train.grad_accum_steps}")
  rules = rules_from_config(config.train)
  batch_sharding = NamedSharding(mesh, P(("data", "fsdp")))
  place = lambda batch: {k: jax.make_array_from_process_local_data(batch_sharding, v) for k, v in batch.items()}

  train_data = make_iterator(make_dataset(config.data, config.train.seed, "train"))
  eval_data = make_dataset(config.data, config.train.seed, "eval")
  run_dir = run_directory(config, resume)  # after the data: bad data leaves no empty run dir

  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    optimizer = make_optimizer(config.train)
    abstract, shardings = state_shardings(model, config, optimizer, mesh, rules)
    checkpointer = Checkpointer(run_dir, keep=config.train.keep_checkpoints)
    start = checkpointer.latest_step() if resume else None
    if start is not None:
      check_resumable(run_dir, config)
      state = checkpointer.restore(abstract, shardings, train_data, step=start)
    else:
      start = 0
      write_json_atomic(os.path.join(run_dir, "config.json"), config_lib.to_dict(config))
      state = create_train_state(model, config, optimizer, shardings)
    num_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))
    train_fn, eval_fn = jit_steps(family, config, shardings)
    run_eval = lambda: evaluate(state.params, state.apply_fn, eval_fn, eval_data,
                                config.train.eval_batches, place)

    total = config.train.steps
    tokens_per_step = config.data.batch_size * config.data.seq_len
    saved_step, preempted = start, False

    def stop_for_nonfinite():  # returns the latest checkpoint step, which stays the latest
      checkpointer.close()
      return saved_step

    guard = NonfiniteGuard(config.train.max_nonfinite_steps, stop_for_nonfinite)
    is_main = jax.process_index() == 0
    bar = tqdm(range(start, total), initial=start, total=total, desc=config.name,
               disable=not (progress and is_main), dynamic_ncols=True)
    clock = time.perf_counter()
    log = MetricsLog(run_dir, config.train.tensorboard)
    with contextlib.closing(log), stop_requests() as stop:
      for step in bar:
        state, metrics = train_fn(state, place(next(train_data)))
        done = step + 1
        guard.push(done, metrics["finite"])
        if done % config.train.log_every == 0 or done == total:
          record = {"step": done, **{k: float(v) for k, v in metrics.items() if k != "count"},
                    "tokens_per_sec": (done - start) * tokens_per_step / (time.perf_counter() - clock)}
          log.write(record)
          bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_sec']:.0f}")
        if config.train.eval_every and done % config.train.eval_every == 0 and done < total:
          log.write({"step": done, **run_eval()})
        if stop["stop"] or (config.train.checkpoint_every and done % config.train.checkpoint_every == 0):
          checkpointer.save(done, state, train_data)
          saved_step = done
        if stop["stop"]:
          preempted = True
          break
      guard.flush()
      final = {"step": saved_step if preempted else total}
      if not preempted:
        final.update(run_eval())
        log.write(final)
        if saved_step != total:
          checkpointer.save(total, state, train_data)
    checkpointer.close()

  summary = {**final, "num_params": num_params, "train_seconds": time.perf_counter() - clock,
             "family": config.model.family, "name": config.name, "preempted": preempted,
             "mesh": dict(mesh.shape)}
  if is_main:
    write_json_atomic(os.path.join(run_dir, "summary.json"), summary)
  return run_dir, summary

"""The training run: mesh, sharded state, Grain data, Orbax checkpoints, preemption, metrics.

Run directory: config.json (the resolved config: enough to rebuild the model), metrics.jsonl
(one JSON object per logged step and per evaluation), summary.json, checkpoints/<step>/ (Orbax:
state + data iterator). The checkpoint step counts batches consumed, so a resumed run reads
exactly the batches the uninterrupted run would have read.

On SIGTERM or SIGINT the current step finishes, a checkpoint is saved and ``train`` returns
normally (exit 0: the scheduler may restart the job with --resume). A non-finite loss or
gradient skips the update; after ``train.max_nonfinite_steps`` of them in a row the run stops
with an error and saves nothing, so the last good checkpoint stays the latest.

Every metric the family's loss returns ({name: (sum, weight)}) is logged as sum / weight:
per logged step in training, and summed over the whole evaluation set (float64, on the host)
in evaluation, where it is written as ``eval_<name>``.
"""

import contextlib
import functools
import json
import os
import shutil
import signal
import threading
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify, multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tqdm.auto import tqdm

from lpcjax import config as config_lib
from lpcjax import interrupts
from lpcjax import models
from lpcjax.data import make_dataset, make_iterator
from lpcjax.files import write_json_atomic
from lpcjax.sharding import check_divisible, make_mesh, rules_from_config

from .checkpoint import Checkpointer, latest_checkpoint_step
from .runs import (RunError, check_same_structure, num_params, parse_run_spec, read_config, restore_checked,
                   restore_state)
from .steps import create_train_state, eval_step, make_optimizer, state_shardings, step_rng, train_step


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


def open_run_directory(config, resume):
  """(run_dir, latest checkpoint step or None, whether this call created the folder), after
  checking what ``resume`` asks of it: False, a new run (a folder with checkpoints is an error);
  True, continue its latest checkpoint (none is an error); "or_start", continue or start."""
  if resume and not config.train.run_name:
    raise config_lib.ConfigError("train.run_name: --resume needs the name of the run to continue")
  if jax.process_count() > 1 and not config.train.run_name:  # each process would time-stamp its own
    raise config_lib.ConfigError("train.run_name: a run of several processes needs a name")
  name = config.train.run_name or f"{config.name}-{time.strftime('%Y%m%d-%H%M%S')}"
  run_dir = os.path.join(config.train.run_dir, name)
  latest = latest_checkpoint_step(run_dir)
  if latest is not None and not resume:
    raise FileExistsError(f"run directory {run_dir} already holds checkpoints; pass --resume to "
                          "continue it or choose another train.run_name")
  if latest is None and resume is True:
    raise RunError(f"{run_dir}: no checkpoint to resume; start it without --resume "
                   "(--resume-or-start does either)")
  if latest is not None and latest > config.train.steps:
    raise config_lib.ConfigError(f"train.steps: {run_dir} is already at step {latest}, past "
                                 f"train.steps={config.train.steps}; set train.steps above {latest} to train on")
  created = not os.path.isdir(run_dir)
  os.makedirs(run_dir, exist_ok=True)
  return run_dir, latest, created


def check_resumable(run_dir, config):
  """The model and data of a resumed run must be the checkpoint's; train.* may change."""
  saved = config_lib.to_dict(read_config(run_dir))
  now = config_lib.to_dict(config)
  for section in ("model", "data"):
    for key in sorted(set(saved[section]) | set(now[section])):
      if (section, key) == ("data", "tokenizer_file"):
        continue  # where the rank file lives may change between machines (runs record it now)
      old, new = saved[section].get(key), now[section].get(key)
      if old != new:
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
  flag["stop"] = flag["stop"] or interrupts.requested()  # a Ctrl-C that start-up code swallowed
  try:
    yield flag
  finally:
    for sig, old in previous.items():
      signal.signal(sig, old)


def stop_agreed(stop):
  """Whether any process was asked to stop. Every process must stop at the same step (saving a
  checkpoint and leaving the loop are collective), so with several processes they agree on it
  at every step; a single process reads its own flag."""
  if jax.process_count() == 1:
    return stop["stop"]
  return bool(np.any(multihost_utils.process_allgather(np.asarray(stop["stop"]))))


def _step_of(line):
  """The step of a metrics.jsonl row; a row cut short by a killed run counts as past any step."""
  try:
    return json.loads(line)["step"]
  except (json.JSONDecodeError, KeyError):
    return float("inf")


class MetricsLog:
  """metrics.jsonl in the run directory, plus TensorBoard if asked for. A run starting at step
  ``start`` keeps only the rows up to it (a run killed after its last checkpoint logged steps
  that its resumption logs again), then appends. Only process 0 writes."""

  def __init__(self, run_dir, tensorboard, start):
    self.enabled = jax.process_index() == 0
    self.file, self.tensorboard = None, None
    if not self.enabled:
      return
    path = os.path.join(run_dir, "metrics.jsonl")
    kept = [line for line in open(path) if _step_of(line) <= start] if os.path.exists(path) else []
    with open(f"{path}.tmp", "w") as f:
      f.writelines(kept)
    os.replace(f"{path}.tmp", path)
    self.file = open(path, "a")
    if tensorboard:
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


def metric_means(metrics):
  """{name: (sum, weight)} -> {name: sum / weight} as Python floats (NaN where weight is 0)."""
  return {name: float(total) / float(weight) if float(weight) else float("nan")
          for name, (total, weight) in metrics.items()}


class TrainingData:
  """The training iterator, the evaluation set and the placement of a process's batches as
  global arrays sharded over the mesh's batch axes."""

  def __init__(self, config, mesh):
    data_ways = mesh.shape["data"] * mesh.shape["fsdp"]
    if config.data.batch_size % (data_ways * config.train.grad_accum_steps):
      raise config_lib.ConfigError(
          f"data.batch_size: {config.data.batch_size} is not divisible by the data axes (data x fsdp "
          f"= {data_ways}) times train.grad_accum_steps={config.train.grad_accum_steps}")
    self.sharding = NamedSharding(mesh, P(("data", "fsdp")))
    self.train = make_iterator(make_dataset(config.data, config.train.seed, "train"))
    max_examples = config.train.eval_batches * config.data.batch_size or None
    self.eval = make_dataset(config.data, config.train.seed, "eval", max_examples=max_examples)

  def place(self, batch):
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(self.sharding, x), batch)

  def evaluate(self, state, eval_fn):
    """``eval_<name>`` = the mean of every metric over the whole evaluation set (sums and
    weights accumulated in float64), ``eval_weight`` the loss's total weight (scored tokens for
    language models) and ``eval_examples`` the number of evaluation examples."""
    totals, examples = {}, 0.0
    for batch in make_iterator(self.eval):
      placed = self.place(batch)
      examples += float(jnp.sum(placed["valid"]))
      for name, (total, weight) in eval_fn(state, placed).items():
        previous = totals.get(name, (0.0, 0.0))
        totals[name] = (previous[0] + float(total), previous[1] + float(weight))
    record = {f"eval_{name}": mean for name, mean in metric_means(totals).items()}
    record.update(eval_weight=totals["loss"][1], eval_examples=int(examples))
    return record


def compiled_steps(family, config, shardings):
  """(train_step, eval_step), jitted; with model.debug_checks the checkify value checks of the
  model raise on the host after the step that failed them."""
  step = functools.partial(train_step, loss_fn=family.loss, accum_steps=config.train.grad_accum_steps,
                           seed=config.train.seed)
  evaluate_batch = functools.partial(eval_step, loss_fn=family.loss)
  if not getattr(config.model, "debug_checks", False):
    return jax.jit(step, donate_argnums=0, out_shardings=(shardings, None)), jax.jit(evaluate_batch)

  def forward_then_step(state, batch):
    # checkify drops the checks raised inside the model's nn.scan layer stack under jax.grad
    # (unrolled layers keep them), so debug mode runs the forward pass once more outside the
    # gradient, where every check reaches the error it returns.
    family.loss(state.apply_fn, state.params, batch, rng=step_rng(config.train.seed, state.step),
                step=state.step, mutable=state.mutable, train=True)
    return step(state, batch)

  checked_step = jax.jit(checkify.checkify(forward_then_step, errors=checkify.user_checks))
  checked_eval = jax.jit(checkify.checkify(evaluate_batch, errors=checkify.user_checks))

  def run_checked(fn, *args):
    err, out = fn(*args)
    err.throw()
    return out

  return functools.partial(run_checked, checked_step), functools.partial(run_checked, checked_eval)


def weights_from_run(spec, abstract, shardings, mesh, rules):
  """(params, mutable collections) of another run's checkpoint (``train.init_from``), checked
  against this model's and placed into this run's shardings."""
  run_dir, step = parse_run_spec(spec)
  _, _, _, other = restore_state(run_dir, mesh, rules, step)
  where = f"{run_dir} (step {int(other.step)})"
  check_same_structure(abstract.params, other.params, where)
  check_same_structure(abstract.mutable, other.mutable, where)
  return jax.device_put((other.params, other.mutable), (shardings.params, shardings.mutable))


def initial_state(family, model, config, run_dir, start, data, checkpointer, abstract, shardings, optimizer,
                  mesh, rules):
  """The checkpoint ``start`` when resuming (not None), else a new state (from
  ``train.init_from``'s weights if set), whose config is written to the run directory."""
  if start is not None:
    return restore_checked(checkpointer, run_dir, abstract, shardings, data.train, step=start)
  state = create_train_state(family, model, config, optimizer, shardings)
  if config.train.init_from:
    params, mutable = weights_from_run(config.train.init_from, abstract, shardings, mesh, rules)
    state = state.replace(params=params, mutable=mutable)
  if jax.process_index() == 0:  # processes share the run directory: one writer
    write_json_atomic(os.path.join(run_dir, "config.json"), config_lib.to_dict(config))
  return state


def train(config, resume=False, progress=True, devices=None):
  """Train ``config`` (an ExperimentConfig); returns (run_dir, summary dict).

  ``resume``: False (a new run), True (continue the run's latest checkpoint) or "or_start".
  Everything that can be checked (config, mesh, shardings, data, run directory) is checked
  before anything is written; a run directory this call created is removed again if it fails or
  is stopped before its first step. A stop request (SIGTERM/SIGINT, to any process) ends the run
  after the current step, with a checkpoint of it.
  """
  family = models.get(config.model.family)
  model = family.build(config.model)
  mesh = make_mesh(config.train, devices)
  rules = rules_from_config(config.train)
  with stop_requests() as stop, jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    data = TrainingData(config, mesh)
    optimizer = make_optimizer(config.train)
    abstract, shardings = state_shardings(family, model, config, optimizer, mesh, rules)
    check_divisible(abstract.params, shardings.params)
    check_divisible(abstract.mutable, shardings.mutable)
    run_dir, start, created = open_run_directory(config, resume)
    if start is not None:
      check_resumable(run_dir, config)
    if start == config.train.steps:
      return run_dir, {"step": start, "already_complete": True, "preempted": False}
    loop = TrainingLoop(config, family, data, run_dir, stop, start or 0)
    try:
      loop.checkpointer = Checkpointer(run_dir, keep=config.train.keep_checkpoints)
      state = initial_state(family, model, config, run_dir, start, data, loop.checkpointer, abstract, shardings,
                            optimizer, mesh, rules)
      train_fn, eval_fn = compiled_steps(family, config, shardings)
      size, clock = num_params(state.params), time.perf_counter()
      final = loop.run(state, train_fn, eval_fn, progress)
    finally:
      if loop.checkpointer is not None:
        loop.checkpointer.close()
      if created and not loop.trained and jax.process_index() == 0:
        shutil.rmtree(run_dir, ignore_errors=True)  # nothing trained: leave nothing behind
    summary = {**final, "num_params": size, "train_seconds": time.perf_counter() - clock,
               "family": config.model.family, "name": config.name, "preempted": loop.preempted,
               "mesh": dict(mesh.shape)}
  if jax.process_index() == 0 and os.path.isdir(run_dir):
    write_json_atomic(os.path.join(run_dir, "summary.json"), summary)
  return run_dir, summary


class TrainingLoop:
  """The step loop from ``start`` to ``train.steps``: log, evaluate, checkpoint, stop on request
  (checked before the first step and after every step). ``trained``: whether a step ran; ``preempted``: whether
  a stop request ended it before ``train.steps``."""

  def __init__(self, config, family, data, run_dir, stop, start):
    self.config, self.family, self.data, self.run_dir, self.stop, self.start = config, family, data, run_dir, stop, start
    self.checkpointer, self.saved_step, self.trained, self.preempted = None, start, False, False

  def _stop_for_nonfinite(self):  # returns the latest checkpoint step, which stays the latest
    self.checkpointer.close()
    return self.saved_step

  def _save(self, step, state):
    self.checkpointer.save(step, state, self.data.train)
    self.saved_step = step

  def run(self, state, train_fn, eval_fn, progress):
    """Returns the final record: the step reached, and the final evaluation unless preempted."""
    cfg, data, start, total = self.config.train, self.data, self.start, self.config.train.steps
    units_per_step = self.config.data.batch_size * self.family.units_per_example(self.config)
    rate_key = f"{self.family.throughput_unit}_per_sec"
    guard = NonfiniteGuard(cfg.max_nonfinite_steps, self._stop_for_nonfinite)
    bar = tqdm(range(start, total), initial=start, total=total, desc=self.config.name,
               disable=not (progress and jax.process_index() == 0), dynamic_ncols=True)
    clock = time.perf_counter()
    log = MetricsLog(self.run_dir, cfg.tensorboard, start)
    with contextlib.closing(log):
      # Asked to stop before the first step (e.g. while the state was built)? After that the flag
      # is read once per step, after the step (one cross-process all-gather per step).
      self.preempted = stop_agreed(self.stop)
      for step in bar:
        if self.preempted:
          break
        state, metrics = train_fn(state, data.place(next(data.train)))
        self.trained, done = True, step + 1
        guard.push(done, metrics["finite"][0])
        if done % cfg.log_every == 0 or done == total:
          record = {"step": done, **metric_means(metrics),
                    rate_key: (done - start) * units_per_step / (time.perf_counter() - clock)}
          log.write(record)
          bar.set_postfix({"loss": f"{record['loss']:.3f}", rate_key: f"{record[rate_key]:.0f}"})
        if done == total:
          break
        if cfg.eval_every and done % cfg.eval_every == 0:
          log.write({"step": done, **data.evaluate(state, eval_fn)})
        stopping = stop_agreed(self.stop)
        if stopping or (cfg.checkpoint_every and done % cfg.checkpoint_every == 0):
          self._save(done, state)
        if stopping:
          self.preempted = True
          break
      guard.flush()
      if self.preempted:
        return {"step": self.saved_step}
      if self.saved_step != total:  # the last checkpoint first: a failing evaluation loses nothing
        self._save(total, state)
      final = {"step": total, **data.evaluate(state, eval_fn)}
      log.write(final)
    return final

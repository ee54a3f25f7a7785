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
import dataclasses
import functools
import os
import shutil
import sys
import time
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tqdm.auto import tqdm

from lpcjax import experiment, models
from lpcjax.config import listed
from lpcjax.data import make_dataset, make_iterator
from lpcjax.files import write_json_atomic
from lpcjax.kernels import platform_problem
from lpcjax.sharding import check_divisible, context_ways, make_mesh, rules_from_config

from .checkpoint import Checkpointer
from .run_directory import RunExistsError  # noqa: F401  (re-exported: train() raises it)
from .run_directory import (MetricsLog, check_resumable, check_same_structure, earlier_train_seconds, metric_means,
                            num_params, open_run_directory, parse_run_spec, restore_checked, restore_variables,
                            set_aside_later_steps)
from .stopping import TrainingError  # noqa: F401  (re-exported: train() raises it)
from .stopping import NonfiniteGuard, stop_agreed, stop_requests
from .steps import (create_train_state, eval_step, learning_rate_schedule, make_optimizer, state_shardings, step_rng,
                    train_step)
from .throughput import mfu, peak_flops


def batch_sharding(mesh, ndim):
  """Where a global batch's leaf of ``ndim`` dims lives: split over the batch axes (data x fsdp)
  and, on a mesh with a context axis, [batch, seq, ...] leaves (tokens, targets, masks, segment
  ids) along their sequence too."""
  if context_ways(mesh) > 1 and ndim >= 2:
    return NamedSharding(mesh, P(("data", "fsdp"), "context"))
  return NamedSharding(mesh, P(("data", "fsdp")))


def check_batch(config, mesh):
  """A one-line ConfigError when the global batch does not split over the mesh's batch axes and
  the accumulation's micro-batches."""
  data_ways = mesh.shape["data"] * mesh.shape["fsdp"]
  if config.data.batch_size % (data_ways * config.train.grad_accum_steps):
    raise experiment.ConfigError(
        f"data.batch_size: {config.data.batch_size} is not divisible by the data axes (data x fsdp "
        f"= {data_ways}) times train.grad_accum_steps={config.train.grad_accum_steps}")


class TrainingData:
  """The training iterator, the evaluation set and the placement of a process's batches as
  global arrays sharded over the mesh's batch axes."""

  def __init__(self, config, mesh):
    check_batch(config, mesh)
    self.mesh = mesh
    self.train = make_iterator(make_dataset(config.data, config.train.seed, "train"))
    max_examples = config.train.eval_batches * config.data.batch_size or None
    self.eval = make_dataset(config.data, config.train.seed, "eval", max_examples=max_examples)

  def place(self, batch):
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(batch_sharding(self.mesh, x.ndim), x), batch)

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


def check_context_family(family, ways):
  """A one-line ConfigError when the sequence is to be split ``ways`` ways and the family
  cannot take it. Checked before the mesh is made too: with too few devices for the mesh, the
  mesh's error would blame train.mesh_data instead."""
  if ways != 1 and not family.context_parallel:
    able = ", ".join(name for name in models.names() if models.get(name).context_parallel)
    raise experiment.ConfigError(f"train.mesh_context: the {family.name} family cannot shard its sequence (a "
                                 f"recurrence runs along it; families that can: {able}); use train.mesh_context=1")


def check_context_parallel(family, config, mesh):
  """A one-line ConfigError when the mesh shards the sequence and the model or its length cannot
  take it (the ring's load-balanced layout cuts the sequence into 2 x mesh_context chunks)."""
  ways = context_ways(mesh)
  if ways == 1:
    return
  check_context_family(family, ways)
  if config.data.seq_len % (2 * ways):
    raise experiment.ConfigError(f"train.mesh_context: {ways}-way context parallelism needs data.seq_len to be a "
                                 f"multiple of {2 * ways}, got {config.data.seq_len}")
  # Each process reads whole sequences of its share of the batch (TrainingData.place), so the
  # devices of one context group must belong to one process.
  processes = np.vectorize(lambda device: device.process_index)(mesh.devices)
  context = list(mesh.axis_names).index("context")
  if (processes != np.take(processes, [0], axis=context)).any():
    raise experiment.ConfigError(f"train.mesh_context: the {ways} devices of a context group must be on one host "
                                 f"(each process reads whole sequences); use at most "
                                 f"{jax.local_device_count()} per host")


def model_and_mesh(config, devices=None):
  """(family, model, mesh, sharding rules) of ``config`` over ``devices`` (default: this
  process's view of all devices), after the family's checks (its attention backend) and the
  mesh's context-parallel checks."""
  family = models.checked_family(config)
  check_context_family(family, config.train.mesh_context if config.train.mesh_context > 0 else 1)
  model = family.build(config.model)
  mesh = make_mesh(config.train, devices)
  check_context_parallel(family, config, mesh)
  return family, model, mesh, rules_from_config(config.train)


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
  _, _, _, params, mutable, step = restore_variables(run_dir, mesh, rules, step)
  where = f"{run_dir} (step {step})"
  check_same_structure(abstract.params, params, where)
  check_same_structure(abstract.mutable, mutable, where)
  return jax.device_put((params, mutable), (shardings.params, shardings.mutable))


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
    write_json_atomic(os.path.join(run_dir, "config.json"), experiment.to_dict(config))
  return state


def start_block(config, num_params, mesh, run_dir, start, resume_command=None):
  """The lines train.py prints before the first step: config, model and size, devices and mesh,
  data and what the evaluation scores, schedule, run directory and the command that resumes the run."""
  model, data, cfg = config.model, config.data, config.train
  describe = f" ({model.describe()})" if hasattr(model, "describe") else ""
  devices = mesh.devices.flatten()
  kinds = ", ".join(sorted({device.device_kind for device in devices}))
  processes = f", {jax.process_count()} processes" if jax.process_count() > 1 else ""
  # the kind's sources (files, token file prefix): what a field naming files or tokens holds
  shown = lambda value: listed(value, sep=",") if isinstance(value, tuple) else value
  sources = [f"{f.name}={shown(value)}" for f in dataclasses.fields(data)
             if ("file" in f.name or "tokens" in f.name) and (value := getattr(data, f.name))
             and not isinstance(value, bool)]
  length = f" x {data.seq_len}" if data.seq_len else " (length from the data)"
  name = os.path.basename(os.path.normpath(run_dir))
  resume = resume_command(name) if resume_command else f"train(config, resume=True) with train.run_name={name!r}"
  return [
      f"config   {config.name}: {model.family}{describe}, {num_params:,} parameters",
      f"devices  {len(devices)} x {kinds}{processes}; mesh "
      + " x ".join(f"{axis} {size}" for axis, size in mesh.shape.items()),
      f"data     {data.kind}, batch {data.batch_size}{length}" + "".join(f"; {s}" for s in sources),
      f"eval     {data.evaluation_data()}",
      f"schedule {cfg.steps} steps, learning rate {cfg.learning_rate:g} (warm-up {cfg.warmup_steps}, cosine to "
      f"{cfg.min_learning_rate:g})" + (f"; resuming at step {start}" if start else ""),
      f"run      {run_dir}",
      f"resume   {resume}",
  ]


def train(config, resume=False, progress=True, devices=None, resume_command=None, hooks=()):
  """Train ``config`` (an ExperimentConfig); returns (run_dir, summary dict).

  ``resume``: False (a new run), True (continue the run's latest checkpoint) or "or_start".
  ``progress``: print the start block (``start_block``; ``resume_command(run_name)`` gives the
  command it shows to resume) and a progress bar.
  ``hooks``: ``Hook``s of the caller's (an experiment file's ``get_hooks(config)``, a
  benchmark), run on their cadence after the loop's own log and evaluation, on every process.
  Everything that can be checked (config, mesh, shardings, data, run directory) is checked
  before anything is written. The run directory is held by this call alone until it returns
  (``RunLock``: a second trainer of the same run stops with a one-line error, having written
  nothing); a run directory this call created is removed again if it fails or
  is stopped before its first step. A stop request (SIGTERM/SIGINT, to any process) ends the run
  after the current step, with a checkpoint of it.
  """
  bad = [hook for hook in hooks if not isinstance(hook, Hook)]
  if bad:
    raise experiment.ConfigError(f"hooks: each must be an lpcjax.training.Hook, got {type(bad[0]).__name__}")
  impl = getattr(config.model, "attention_impl", None)
  problem = impl and platform_problem(impl)  # the config check could not know where it would run
  if problem:
    raise experiment.ConfigError(f"model.attention_impl: {problem}")
  family, model, mesh, rules = model_and_mesh(config, devices)
  with stop_requests() as stop, jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    data = TrainingData(config, mesh)
    optimizer = make_optimizer(config.train)
    abstract, shardings = state_shardings(family, model, config, optimizer, mesh, rules)
    check_divisible(abstract.params, shardings.params)
    check_divisible(abstract.mutable, shardings.mutable)
    run_dir, start, created, lock = open_run_directory(config, resume)
    with lock:  # held until the summary is written, on every way out
      if start is not None:
        check_resumable(run_dir, config)
      if start == config.train.steps:
        return run_dir, {"step": start, "already_complete": True, "preempted": False}
      loop = TrainingLoop(config, family, data, run_dir, stop, start or 0, hooks)
      try:
        loop.checkpointer = Checkpointer(run_dir, keep=config.train.keep_checkpoints)
        state = initial_state(family, model, config, run_dir, start, data, loop.checkpointer, abstract, shardings,
                              optimizer, mesh, rules)
        if config.train.resume_step is not None:  # restored: only now do the later steps go aside
          loop.checkpointer.close()
          set_aside_later_steps(run_dir, start)
          loop.checkpointer = Checkpointer(run_dir, keep=config.train.keep_checkpoints)
        train_fn, eval_fn = compiled_steps(family, config, shardings)
        size, clock = num_params(state.params), time.perf_counter()
        loop.flops_per_unit = family.flops_per_unit and family.flops_per_unit(config, state.params)
        loop.peak = peak_flops(mesh.devices.flatten(), config.train.peak_tflops)
        if progress and jax.process_index() == 0:
          lines = start_block(config, size, mesh, run_dir, start, resume_command)
          if not loop.flops_per_unit:  # said once here, not on every log row
            lines.append(f"mfu      not logged: the {family.name} family gives no FLOPs estimate "
                         "(Family.flops_per_unit)")
          print("\n".join(lines), flush=True)
        final = loop.run(state, train_fn, eval_fn, progress)
      finally:
        if loop.checkpointer is not None:
          loop.checkpointer.close()
        if created and not loop.trained and lock.held:
          shutil.rmtree(run_dir, ignore_errors=True)  # nothing trained: leave nothing behind
      # a resumed run counts the time its earlier part trained too
      train_seconds = earlier_train_seconds(run_dir, start) + time.perf_counter() - clock
      summary = {**final, "num_params": size, "train_seconds": train_seconds,
                 "family": config.model.family, "name": config.name, "preempted": loop.preempted,
                 "mesh": dict(mesh.shape), "eval_data": config.data.evaluation_data()}
      if jax.process_index() == 0 and os.path.isdir(run_dir):
        write_json_atomic(os.path.join(run_dir, "summary.json"), summary)
  return run_dir, summary


@dataclasses.dataclass(frozen=True)
class Hook:
  """Something the loop does after a step, on its own cadence: ``action(step, state, metrics)``
  runs after every ``every``-th step (0: never by cadence), after the last step if
  ``at_last_step``, and before the first step of this call, with ``metrics`` None, if
  ``at_start``. ``state`` is the TrainState (``params``, ``mutable``, ``apply_fn``,
  ``step``); ``metrics`` the step's {name: (sum, weight)} as device arrays. The loop's own
  hooks (log, evaluate, checkpoint, stop) are built the same way; evaluation and the
  checkpoint skip the last step, which the loop saves and evaluates itself."""

  every: int
  action: Callable
  at_last_step: bool = True
  at_start: bool = False

  def due(self, step, total):
    if step == total:
      return self.at_last_step
    return self.every > 0 and step % self.every == 0


class TrainingLoop:
  """The step loop from ``start`` to ``train.steps``, its cadence as hooks (``hooks()``): log,
  evaluate, checkpoint, and stop on request (checked before the first step and after every
  step). ``trained``: whether a step ran; ``preempted``: whether a stop request ended it before
  ``train.steps``."""

  def __init__(self, config, family, data, run_dir, stop, start, extra_hooks=()):
    self.config, self.family, self.data, self.extra_hooks = config, family, data, tuple(extra_hooks)
    self.run_dir, self.stop, self.start = run_dir, stop, start
    self.checkpointer, self.saved_step, self.trained, self.preempted = None, start, False, False
    self.plain_progress = False  # set by run(): progress as plain lines, stderr not being a terminal
    self.flops_per_unit, self.peak = None, None  # for MFU: the model's FLOPs per unit, the devices' FLOP/s

  def _stop_for_nonfinite(self):  # returns the latest checkpoint step, which stays the latest
    self.checkpointer.close()
    return self.saved_step

  def _save(self, step, state):
    if step != self.saved_step:  # the config too: a run that lost config.json reads it from here
      self.checkpointer.save(step, state, self.data.train, config=experiment.to_dict(self.config))
      self.saved_step = step

  def hooks(self, log, eval_fn, clock):
    """[log metrics, evaluate, the caller's hooks, checkpoint, stop on request], in the order
    they run."""
    cfg = self.config.train
    units_per_step = self.config.data.batch_size * self.family.units_per_example(self.config)
    rate_key = f"{self.family.throughput_unit}_per_sec"
    schedule = learning_rate_schedule(cfg)
    since = {"step": self.start, "time": clock}  # the previous log row: rates are over the steps since

    def log_metrics(step, state, metrics):
      means = metric_means(metrics)  # waits for the step: the clock below counts finished steps
      now = time.perf_counter()
      step_seconds = (now - since["time"]) / (step - since["step"])
      since.update(step=step, time=now)
      record = {"step": step, **means, "learning_rate": float(schedule(step - 1)),  # of this step's update
                "step_seconds": step_seconds, rate_key: units_per_step / step_seconds}
      utilisation = mfu(self.flops_per_unit, record[rate_key], self.peak)
      if utilisation is not None:
        record["mfu"] = utilisation
      log.write(record)
      self.bar.set_postfix({"loss": f"{record['loss']:.3f}", rate_key: f"{record[rate_key]:.0f}"})
      if self.plain_progress:
        print(f"{self.config.name} step {step}/{self.config.train.steps}: loss {record['loss']:.4g}, "
              f"{record[rate_key]:.0f} {rate_key.replace('_per_sec', '/s')}", file=sys.stderr, flush=True)

    def evaluate(step, state, metrics):
      log.write({"step": step, **self.data.evaluate(state, eval_fn)})

    def stop_on_request(step, state, metrics):  # one cross-process all-gather per step
      if stop_agreed(self.stop):
        self._save(step, state)
        self.preempted = True

    save = Hook(cfg.checkpoint_every, lambda step, state, _: self._save(step, state), at_last_step=False)
    return [Hook(cfg.log_every, log_metrics), Hook(cfg.eval_every, evaluate, at_last_step=False),
            *self.extra_hooks, save, Hook(1, stop_on_request, at_last_step=False)]

  def run(self, state, train_fn, eval_fn, progress):
    """Returns the final record: the step reached, and the final evaluation unless preempted."""
    cfg, data, start, total = self.config.train, self.data, self.start, self.config.train.steps
    guard = NonfiniteGuard(cfg.max_nonfinite_steps, self._stop_for_nonfinite)
    # Updated after each step (iterating the bar counted a step when the next began, so it ended at N-1/N)
    shown = progress and jax.process_index() == 0
    # A bar redraws in place on a terminal; written to a file it would be a line per step, so
    # there the log rows print one plain line each instead (``log_metrics``).
    self.plain_progress = shown and not sys.stderr.isatty()
    self.bar = tqdm(initial=start, total=total, desc=self.config.name, disable=not shown or self.plain_progress,
                    dynamic_ncols=True)
    log = MetricsLog(self.run_dir, cfg.tensorboard, start)
    with contextlib.closing(log), contextlib.closing(self.bar):
      hooks = self.hooks(log, eval_fn, time.perf_counter())
      for hook in hooks:
        if hook.at_start:
          hook.action(start, state, None)
      # Asked to stop before the first step (e.g. while the state was built)?
      self.preempted = stop_agreed(self.stop)
      for step in range(start, total):
        if self.preempted:
          break
        state, metrics = train_fn(state, data.place(next(data.train)))
        self.trained, done = True, step + 1
        guard.push(done, metrics["finite"][0])
        self.bar.update(1)
        for hook in hooks:
          if hook.due(done, total):
            hook.action(done, state, metrics)
      guard.flush()
      if self.preempted:
        return {"step": self.saved_step}
      self._save(total, state)  # the last checkpoint first: a failing evaluation loses nothing
      final = {"step": total, **data.evaluate(state, eval_fn)}
      log.write(final)
    return final

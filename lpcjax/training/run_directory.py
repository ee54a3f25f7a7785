"""A run directory, the one module that reads and writes one: its config.json (read once per
command), its checkpointed state read back (whole, to resume; params and mutable collections
only, to evaluate, generate and start from its weights with ``train.init_from``), and the
trainer's side: created or resumed (with the checks that make a resume safe), and its metrics
log (metrics.jsonl, TensorBoard). A run loaded for evaluation and generation (``load_run``) is
one floor up, in ``lpcjax.runs``.
"""

import contextlib
import json
import os
import re
import shutil
import sys
import time

import jax
import numpy as np
from jax.experimental import multihost_utils

from lpcjax import experiment, models
from lpcjax.config import ConfigError
from lpcjax.errors import RunError, UserError, warn
from lpcjax.files import check_run_path, filesystem_problem, write_json_atomic
from lpcjax.layers.common import num_params  # noqa: F401  (re-exported for the trainer)

from .checkpoint import (Checkpointer, DamagedCheckpointError, IncompleteCheckpointError, TreeMismatchError,
                         checkpoint_steps, has_checkpoint, latest_checkpoint_step, saved_config, tree_mismatch)
from .run_lock import RunLock, RunLockedError
from .steps import make_optimizer, state_shardings, variable_shardings


def read_config(run_dir):
  """The ExperimentConfig saved in ``run_dir``/config.json; where that file is gone, the copy the
  latest checkpoint carries (with a note on stderr). A path that is not a run directory (absent,
  a file, a folder without config or checkpoints) is a one-line RunError saying which."""
  path = os.path.join(run_dir, "config.json")
  if os.path.isfile(path):
    with open(path) as f:
      return experiment.from_dict(json.load(f))
  check_run_path(run_dir)
  saved = saved_config(run_dir)
  if saved is not None:
    step, values = saved
    warn(f"{run_dir} has no config.json: using the config saved with checkpoint step {step} "
         "(a resumed run writes config.json again)")
    return experiment.from_dict(values)
  if has_checkpoint(run_dir):
    raise RunError(f"{run_dir}: no config.json, and its checkpoints (written before lpcjax saved the config with "
                   "each step) carry none: write it again with the command that started the run, plus "
                   f"--print-config > {path}")
  raise RunError(f"{run_dir}: not a run directory (no config.json, no checkpoint)")


def restore_config_file(run_dir, config):
  """config.json written again from ``config`` (the checkpoint's) where a resumed run lost it."""
  path = os.path.join(run_dir, "config.json")
  if not os.path.isfile(path) and jax.process_index() == 0:
    write_json_atomic(path, experiment.to_dict(config))
    print(f"note: wrote {path} again from the config its latest checkpoint carries", file=sys.stderr)


def _restore(run_dir, config, step, read):
  """``read(checkpointer, family, model, step)`` on ``run_dir``'s checkpoint ``step`` (default:
  the latest), with the one-line errors of a missing checkpoint or step."""
  if not has_checkpoint(run_dir):
    raise RunError(f"{run_dir}: no checkpoint (has the run saved one?)")
  family = models.checked_family(config)
  model = family.build(config.model)
  checkpointer = Checkpointer(run_dir)
  try:
    steps = checkpointer.all_steps()
    if step is not None and step not in steps:
      raise RunError(f"{run_dir}: no checkpoint at step {step}; it has {', '.join(map(str, steps))}")
    return family, model, read(checkpointer, family, model, steps[-1] if step is None else step)
  finally:
    checkpointer.close()


def restore_state(run_dir, mesh, rules, step=None, config=None):
  """(config, family, model, TrainState) of ``run_dir``'s checkpoint ``step`` (default: the
  latest), restored into the shardings its logical names get under ``rules`` on ``mesh``.
  ``config``: the run's, when already read. Call under ``jax.set_mesh(mesh)`` and
  ``nn.logical_axis_rules(rules)``."""
  config = read_config(run_dir) if config is None else config

  def read(checkpointer, family, model, step):
    abstract, shardings = state_shardings(family, model, config, make_optimizer(config.train), mesh, rules)
    return restore_checked(checkpointer, run_dir, abstract, shardings, step=step)

  family, model, state = _restore(run_dir, config, step, read)
  return config, family, model, state


def restore_variables(run_dir, mesh, rules, step=None, config=None):
  """(config, family, model, params, mutable collections, step) of ``run_dir``'s checkpoint
  ``step`` (default: the latest), without the optimizer state (``Checkpointer.restore_variables``):
  evaluation, generation and ``train.init_from``. Arguments as ``restore_state``."""
  config = read_config(run_dir) if config is None else config

  def read(checkpointer, family, model, step):
    (params, mutable), shardings = variable_shardings(family, model, config, mesh, rules)
    return restore_checked(checkpointer, run_dir, params, mutable, shardings, step=step, variables_only=True), step

  family, model, ((params, mutable), step) = _restore(run_dir, config, step, read)
  return config, family, model, params, mutable, step


def restore_checked(checkpointer, run_dir, *args, variables_only=False, **kwargs):
  """``checkpointer.restore(*args, **kwargs)`` (``restore_variables`` when ``variables_only``),
  with a one-line RunError when the checkpoint's tree does not match the model's (see
  ``tree_mismatch``)."""
  restore = checkpointer.restore_variables if variables_only else checkpointer.restore
  try:
    return restore(*args, **kwargs)
  except (TreeMismatchError, IncompleteCheckpointError) as error:
    raise RunError(f"{run_dir}: {error}") from None
  except DamagedCheckpointError as error:
    raise RunError(f"{run_dir}: {error}; no file was changed. {earlier_step_advice(checkpointer, error)}") from None
  except ValueError as error:
    mismatch = tree_mismatch(error)
    if mismatch is None:
      raise
    raise RunError(f"{run_dir}: {mismatch}") from None


def earlier_step_advice(checkpointer, error):
  """What to do about a damaged step (named in ``error``'s message): the nearest other step whose
  files look whole (``Checkpointer.looks_whole``; an earlier one first), and how each command
  takes it."""
  damaged = int(re.search(r"checkpoint step (\d+)", str(error))[1])
  steps = checkpointer.all_steps()
  candidates = [s for s in reversed(steps) if s < damaged] + [s for s in steps if s > damaged]
  whole = next((step for step in candidates if checkpointer.looks_whole(step)), None)
  if whole is None:
    return (f"No other step looks whole ({len(candidates)} other); copy step {damaged} again from a backup "
            "or start a new run (train.init_from=RUN:STEP takes the weights of another run's step)")
  which = "previous" if whole < damaged else "next"
  return (f"The {which} step whose files look whole is {whole}: evaluate or generate from it with --step {whole}, "
          f"resume from it with --resume train.resume_step={whole}, start from its weights with "
          f"train.init_from=RUN:{whole}, or copy step {damaged} again from a backup")


def parse_run_spec(spec):
  """'RUN_DIR' or 'RUN_DIR:STEP' -> (run_dir, step or None)."""
  run_dir, sep, step = spec.rpartition(":")
  if sep and step.isdigit():
    return run_dir, int(step)
  return spec, None


def check_same_structure(expected, found, what):
  """Raise a ConfigError naming the first path whose presence, shape or dtype differs."""
  want = {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(expected)}
  have = {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(found)}
  for path in sorted(set(want) | set(have)):
    if path not in have:
      raise ConfigError(f"train.init_from: {what} has no {path} (this model needs one of "
                                   f"shape {tuple(want[path].shape)})")
    if path not in want:
      raise ConfigError(f"train.init_from: {what} has {path}, which this model does not")
    if (want[path].shape, want[path].dtype) != (have[path].shape, have[path].dtype):
      raise ConfigError(
          f"train.init_from: {path} is {have[path].dtype}{list(have[path].shape)} in {what}, this model "
          f"needs {want[path].dtype}{list(want[path].shape)}")


# ----------------------------------------------------------------------------- the trainer's side


class RunExistsError(UserError, FileExistsError):
  """A new run whose directory already holds checkpoints (pass --resume to continue it)."""


def open_run_directory(config, resume):
  """(run_dir, latest checkpoint step or None, whether this call created the folder, its
  RunLock), after holding the folder for this trainer alone (``RunLock``: a second trainer
  stops here, having written nothing) and checking what ``resume`` asks of it: False, a new run
  (a folder with checkpoints is an error); True, continue its latest checkpoint (none is an
  error); "or_start", continue or start. On an error nothing stays behind: the lock is released
  and a folder this call created is removed. In a run of several processes process 0 holds the
  lock for all, and all of them raise if it could not."""
  if config.train.resume_step is not None and not resume:
    raise ConfigError("train.resume_step: continues a run from one of its checkpoints; pass --resume")
  if resume and not config.train.run_name:
    runs = sorted(name for name in os.listdir(config.train.run_dir) if has_checkpoint(
        os.path.join(config.train.run_dir, name))) if os.path.isdir(config.train.run_dir) else []
    listed = f" (runs in {config.train.run_dir}: {', '.join(runs[-5:])})" if runs else ""
    raise ConfigError(f"train.run_name: --resume needs the name of the run to continue: train.run_name=NAME{listed}")
  if jax.process_count() > 1 and not config.train.run_name:  # each process would time-stamp its own
    raise ConfigError("train.run_name: a run of several processes needs a name")
  name = config.train.run_name or f"{config.name}-{time.strftime('%Y%m%d-%H%M%S')}"
  run_dir = os.path.join(config.train.run_dir, name)
  if resume is True and not has_checkpoint(run_dir):  # before a folder is made for it
    raise RunError(f"{run_dir}: no checkpoint to resume; start it without --resume "
                   "(--resume-or-start does either)")
  created, lock = not os.path.isdir(run_dir), RunLock(run_dir)
  try:
    _hold(run_dir, lock)
    if lock.note():
      print(lock.note(), file=sys.stderr)
    return (run_dir, _checked_start(run_dir, config, resume), created, lock)
  except BaseException as error:
    # a folder made by this call goes, unless a trainer that started beside it holds it now
    if created and (lock.held or not isinstance(error, RunLockedError)):
      shutil.rmtree(run_dir, ignore_errors=True)
    lock.release()
    raise


def _hold(run_dir, lock):
  """Make ``run_dir`` (and its parents) and hold it: process 0 takes ``lock``, and every
  process learns whether it could."""
  error = None
  if jax.process_index() == 0:
    try:
      os.makedirs(run_dir, exist_ok=True)
    except OSError as problem:
      error = filesystem_problem(problem, run_dir, "choose a writable folder with train.run_dir=PATH")
    else:
      try:
        lock.acquire()
      except UserError as problem:
        error = problem
      except OSError as problem:  # writing its name into the lock file: a full disk, say
        error = filesystem_problem(problem, run_dir, "choose a writable folder with train.run_dir=PATH")
  if jax.process_count() > 1:
    failed = multihost_utils.broadcast_one_to_all(np.int32(error is not None))
    if failed and error is None:
      error = RunLockedError(f"{run_dir}: process 0 could not hold the run directory (its error says why)")
  if error is not None:
    raise error


def _checked_start(run_dir, config, resume):
  """The step a trainer holding ``run_dir`` starts from (None: a new run), after the checks."""
  latest = latest_checkpoint_step(run_dir)
  if latest is not None and not resume:
    raise RunExistsError(f"run directory {run_dir} already holds checkpoints; pass --resume to "
                         "continue it or choose another train.run_name")
  if config.train.resume_step is not None:  # checked now; the later steps go aside once it is restored
    _later_steps(run_dir, config.train.resume_step)
    latest = config.train.resume_step
  if latest is not None and latest > config.train.steps:
    raise ConfigError(f"train.steps: {run_dir} is already at step {latest}, past "
                      f"train.steps={config.train.steps}; set train.steps above {latest} to train on")
  return latest


def _later_steps(run_dir, step):
  """The checkpoint steps after ``step`` (which must exist), each checked to have a free place
  under RUN/checkpoints_set_aside/: every process checks, so none goes on alone."""
  steps = checkpoint_steps(run_dir)
  if step not in steps:
    raise ConfigError(f"train.resume_step: {run_dir} has no checkpoint at step {step}; it has "
                      f"{', '.join(map(str, steps)) or 'none'}")
  later = [s for s in steps if s > step]
  for s in later:
    target = os.path.join(run_dir, "checkpoints_set_aside", str(s))
    if os.path.exists(target):
      raise ConfigError(f"train.resume_step: {target} exists already; move it away to set step {s} aside")
  return later


def set_aside_later_steps(run_dir, step):
  """Move the checkpoint steps after ``step`` to RUN/checkpoints_set_aside/ (kept, never deleted:
  the resumed run saves those steps again, and Orbax never writes over a step), once step
  ``step`` is restored (``train.resume_step``; checked with the run directory, before anything
  is written). Process 0 moves; every process waits for it."""
  later = _later_steps(run_dir, step)
  moves = [(os.path.join(run_dir, "checkpoints", str(s)), os.path.join(run_dir, "checkpoints_set_aside", str(s)))
           for s in later]
  if moves and jax.process_index() == 0:
    os.makedirs(os.path.join(run_dir, "checkpoints_set_aside"), exist_ok=True)
    for source, target in moves:
      shutil.move(source, target)
    print(f"note: train.resume_step={step}: later steps {', '.join(map(str, later))} moved to "
          f"{os.path.join(run_dir, 'checkpoints_set_aside')} (kept; the run saves those steps again)", file=sys.stderr)
  if moves and jax.process_count() > 1:
    multihost_utils.sync_global_devices("lpcjax: later checkpoint steps set aside")


def check_resumable(run_dir, config):
  """The model and data of a resumed run must be the checkpoint's; train.* may change. A run
  that lost its config.json gets it back (``restore_config_file``) once this check passes."""
  run_config = read_config(run_dir)  # the run's, not the one being resumed with
  saved = experiment.to_dict(run_config)
  now = experiment.to_dict(config)
  for section in ("model", "data"):
    for key in sorted(set(saved[section]) | set(now[section])):
      if (section, key) == ("data", "tokenizer_file"):
        continue  # where the rank file lives may change between machines (runs record it now)
      old, new = saved[section].get(key), now[section].get(key)
      if old != new:
        raise ConfigError(f"{section}.{key}: the checkpoint in {run_dir} was trained with "
                                     f"{old!r}, this config says {new!r}")
  restore_config_file(run_dir, run_config)


def earlier_train_seconds(run_dir, start):
  """The training time before step ``start`` of a resumed run: the ``train_seconds`` of the
  summary its stop wrote at that step (0 for a new run, or when the run stopped without one:
  killed, then resumed from an earlier checkpoint, whose time is not known)."""
  if not start:
    return 0.0
  try:
    with open(os.path.join(run_dir, "summary.json")) as f:
      summary = json.load(f)
  except (OSError, ValueError):
    return 0.0
  return float(summary.get("train_seconds", 0.0)) if summary.get("step") == start else 0.0


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
    self.path = path = os.path.join(run_dir, "metrics.jsonl")
    kept = [line for line in open(path) if _step_of(line) <= start] if os.path.exists(path) else []
    with open(f"{path}.tmp", "w") as f:
      f.writelines(kept)
    os.replace(f"{path}.tmp", path)
    self.file = open(path, "a")
    if tensorboard:
      try:
        from tensorboardX import SummaryWriter
      except ImportError:
        raise ConfigError("train.tensorboard: needs tensorboardX "
                                     "(pip install 'lpcjax[tensorboard]')") from None
      self.tensorboard = SummaryWriter(os.path.join(run_dir, "tensorboard"))

  def write(self, record):
    """Append ``record``; a file system that refuses it (a full disk, say) ends the run in one
    line: the checkpoints are written apart, and those saved so far stay whole (one in flight
    that fails too says so itself, when the trainer closes the checkpointer)."""
    if not self.enabled:
      return
    try:
      self.file.write(json.dumps(record) + "\n")
      self.file.flush()
    except OSError as error:
      file, self.file = self.file, None
      with contextlib.suppress(OSError):  # its buffer cannot be written either; the file is closed all the same
        file.close()
      raise filesystem_problem(error, self.path, "the checkpoints saved so far stay whole: make room, then resume "
                                                 "the run (--resume)") from None
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

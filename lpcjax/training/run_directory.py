"""A run directory as the trainer opens and writes it: created or resumed (with the checks that
make a resume safe), and its metrics log (metrics.jsonl, TensorBoard)."""

import json
import os
import time

import jax

from lpcjax import experiment
from lpcjax.errors import UserError

from .checkpoint import latest_checkpoint_step
from .runs import RunError, read_config


class RunExistsError(UserError, FileExistsError):
  """A new run whose directory already holds checkpoints (pass --resume to continue it)."""


def open_run_directory(config, resume):
  """(run_dir, latest checkpoint step or None, whether this call created the folder), after
  checking what ``resume`` asks of it: False, a new run (a folder with checkpoints is an error);
  True, continue its latest checkpoint (none is an error); "or_start", continue or start."""
  if resume and not config.train.run_name:
    raise experiment.ConfigError("train.run_name: --resume needs the name of the run to continue")
  if jax.process_count() > 1 and not config.train.run_name:  # each process would time-stamp its own
    raise experiment.ConfigError("train.run_name: a run of several processes needs a name")
  name = config.train.run_name or f"{config.name}-{time.strftime('%Y%m%d-%H%M%S')}"
  run_dir = os.path.join(config.train.run_dir, name)
  latest = latest_checkpoint_step(run_dir)
  if latest is not None and not resume:
    raise RunExistsError(f"run directory {run_dir} already holds checkpoints; pass --resume to "
                          "continue it or choose another train.run_name")
  if latest is None and resume is True:
    raise RunError(f"{run_dir}: no checkpoint to resume; start it without --resume "
                   "(--resume-or-start does either)")
  if latest is not None and latest > config.train.steps:
    raise experiment.ConfigError(f"train.steps: {run_dir} is already at step {latest}, past "
                                 f"train.steps={config.train.steps}; set train.steps above {latest} to train on")
  created = not os.path.isdir(run_dir)
  os.makedirs(run_dir, exist_ok=True)
  return run_dir, latest, created


def check_resumable(run_dir, config):
  """The model and data of a resumed run must be the checkpoint's; train.* may change."""
  saved = experiment.to_dict(read_config(run_dir))
  now = experiment.to_dict(config)
  for section in ("model", "data"):
    for key in sorted(set(saved[section]) | set(now[section])):
      if (section, key) == ("data", "tokenizer_file"):
        continue  # where the rank file lives may change between machines (runs record it now)
      old, new = saved[section].get(key), now[section].get(key)
      if old != new:
        raise experiment.ConfigError(f"{section}.{key}: the checkpoint in {run_dir} was trained with "
                                     f"{old!r}, this config says {new!r}")


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
        raise experiment.ConfigError("train.tensorboard: needs tensorboardX "
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

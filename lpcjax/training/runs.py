"""What a run directory holds, read back: its config and its checkpointed state.

Used to resume, to start a run from another run's weights (``train.init_from``) and to
evaluate (``lpcjax.evaluation``).
"""

import json
import os

import jax

from lpcjax import experiment, models
from lpcjax.config import ConfigError
from lpcjax.errors import UserError
from lpcjax.layers.common import num_params  # noqa: F401  (re-exported for the trainer)

from .checkpoint import Checkpointer, TreeMismatchError, has_checkpoint, tree_mismatch
from .steps import make_optimizer, state_shardings


class RunError(UserError, ValueError):
  """A run directory that cannot be read: no config.json, no checkpoint, no such step."""


def read_config(run_dir):
  """The ExperimentConfig saved in ``run_dir``/config.json."""
  path = os.path.join(run_dir, "config.json")
  if not os.path.isfile(path):
    raise RunError(f"{run_dir}: no config.json, not a run directory")
  with open(path) as f:
    return experiment.from_dict(json.load(f))


def restore_state(run_dir, mesh, rules, step=None):
  """(config, family, model, TrainState) of ``run_dir``'s checkpoint ``step`` (default: the
  latest), restored into the shardings its logical names get under ``rules`` on ``mesh``.
  Call under ``jax.set_mesh(mesh)`` and ``nn.logical_axis_rules(rules)``."""
  config = read_config(run_dir)
  if not has_checkpoint(run_dir):
    raise RunError(f"{run_dir}: no checkpoint (has the run saved one?)")
  family = models.get(config.model.family)
  model = family.build(config.model)
  abstract, shardings = state_shardings(family, model, config, make_optimizer(config.train), mesh, rules)
  checkpointer = Checkpointer(run_dir)
  try:
    steps = checkpointer.all_steps()
    if step is not None and step not in steps:
      raise RunError(f"{run_dir}: no checkpoint at step {step}; it has {', '.join(map(str, steps))}")
    state = restore_checked(checkpointer, run_dir, abstract, shardings, step=step)
  finally:
    checkpointer.close()
  return config, family, model, state


def restore_checked(checkpointer, run_dir, *args, **kwargs):
  """``checkpointer.restore(*args, **kwargs)``, with a one-line RunError when the checkpoint's
  tree does not match the model's (see ``tree_mismatch``)."""
  try:
    return checkpointer.restore(*args, **kwargs)
  except TreeMismatchError as error:
    raise RunError(f"{run_dir}: {error}") from None
  except ValueError as error:
    mismatch = tree_mismatch(error)
    if mismatch is None:
      raise
    raise RunError(f"{run_dir}: {mismatch}") from None


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

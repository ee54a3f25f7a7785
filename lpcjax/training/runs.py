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
from .steps import make_optimizer, state_shardings, variable_shardings


class RunError(UserError, ValueError):
  """A run directory that cannot be read: no config.json, no checkpoint, no such step."""


def read_config(run_dir):
  """The ExperimentConfig saved in ``run_dir``/config.json."""
  path = os.path.join(run_dir, "config.json")
  if not os.path.isfile(path):
    raise RunError(f"{run_dir}: no config.json, not a run directory")
  with open(path) as f:
    return experiment.from_dict(json.load(f))


def _restore(run_dir, config, step, read):
  """``read(checkpointer, family, model, step)`` on ``run_dir``'s checkpoint ``step`` (default:
  the latest), with the one-line errors of a missing checkpoint or step."""
  if not has_checkpoint(run_dir):
    raise RunError(f"{run_dir}: no checkpoint (has the run saved one?)")
  family = models.get(config.model.family)
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

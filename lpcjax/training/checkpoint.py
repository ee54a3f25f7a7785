"""Orbax checkpoints: train state and data-iterator state in one step. The only module that
imports orbax.

Each save writes <run_dir>/checkpoints/<step>/ with two items: ``state`` (params, optimizer
state, step, the model's mutable collections; sharded arrays written by every process) and ``data``
(the Grain iterator state).
Orbax writes into a temporary directory and renames it when complete, and refuses to write a
step that exists, so a failed or interrupted run never replaces a good checkpoint.
"""

import os
import re

import grain
import jax
import orbax.checkpoint as ocp


def checkpoint_dir(run_dir):
  return os.path.abspath(os.path.join(run_dir, "checkpoints"))


def latest_checkpoint_step(run_dir):
  """The highest complete checkpoint step in ``run_dir`` (Orbax renames a step's folder to its
  number only when it is complete), or None."""
  path = checkpoint_dir(run_dir)
  steps = [int(name) for name in os.listdir(path) if name.isdigit()] if os.path.isdir(path) else []
  return max(steps, default=None)


def has_checkpoint(run_dir):
  return latest_checkpoint_step(run_dir) is not None


def tree_mismatch(error):
  """A one-line description of a failed restore whose saved tree differs from the model's (e.g.
  a checkpoint written by another version of the model code), or None for any other error.
  Orbax lists every differing subtree over pages; this names the first, preferring params."""
  shapes = re.search(r"Requested shape: (\([^)]*\)) is not compatible with the stored shape: (\([^)]*\))",
                     str(error))
  if shapes:
    return (f"the checkpoint does not match the model built from config.json (an array of shape {shapes[2]} "
            f"where the model needs {shapes[1]}); was it written by another version of the model code?")
  found = re.findall(r"^(\S+):\n\s+- Source: (MISSING)?.*\n\s+- Target: (MISSING)?", str(error), re.M)
  if not found:
    return None
  found.sort(key=lambda item: not item[0].startswith("params"))
  path, model_missing, saved_missing = found[0]  # Orbax's "source" is the model's tree
  side = ("the checkpoint lacks it" if saved_missing else
          "the model has no such entry" if model_missing else "its shape or type differs")
  return (f"the checkpoint does not match the model built from config.json ({len(found)} differing entries; first: "
          f"{path}: {side}); was it written by another version of the model code?")


def _saved_fields(state):
  """The checkpointed part of a TrainState, as a dict. An empty ``mutable`` is left out, so the
  checkpoints of models without mutable collections keep the layout they have always had."""
  fields = {"step": state.step, "params": state.params, "opt_state": state.opt_state}
  if state.mutable:
    fields["mutable"] = state.mutable
  return fields


class Checkpointer:
  """Save/restore (state, data iterator) pairs; keeps the last ``keep`` steps; saves async."""

  def __init__(self, run_dir, keep=3):
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=True,
                                           create=True)
    self.manager = ocp.CheckpointManager(checkpoint_dir(run_dir), options=options)

  def latest_step(self):
    return self.manager.latest_step()

  def all_steps(self):
    return sorted(self.manager.all_steps())

  def save(self, step, state, data_iterator=None):
    """Save ``state`` and, when given, the data iterator's position (a converted checkpoint,
    ``lpcjax.convert``, has none: it can be evaluated and fine-tuned from, not resumed)."""
    items = {"state": ocp.args.StandardSave(_saved_fields(state))}
    if data_iterator is not None:
      items["data"] = grain.checkpoint.CheckpointSave(data_iterator)
    self.manager.save(step, args=ocp.args.Composite(**items), force=True)

  def restore(self, abstract_state, shardings, data_iterator=None, step=None):
    """Restore the state into ``shardings`` (any mesh: Orbax reshards) and, given the data
    iterator, its position too (evaluation passes none). Latest step by default."""
    step = self.latest_step() if step is None else step
    target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          abstract_state, shardings)
    items = {"state": ocp.args.StandardRestore(_saved_fields(target))}
    if data_iterator is not None:
      items["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
    return target.replace(**self.manager.restore(step, args=ocp.args.Composite(**items))["state"])

  def close(self):
    """Wait for pending saves and release the manager; closing twice is harmless."""
    if self.manager is not None:
      self.manager.wait_until_finished()
      self.manager.close()
      self.manager = None

"""Orbax checkpoints: train state and data-iterator state in one step. The only module that
imports orbax.

Each save writes <run_dir>/checkpoints/<step>/ with two items: ``state`` (params, optimizer
state, step, the model's mutable collections; sharded arrays written by every process) and ``data``
(the Grain iterator state).
Orbax writes into a temporary directory and renames it when complete, and refuses to write a
step that exists, so a failed or interrupted run never replaces a good checkpoint.
"""

import os

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

  def save(self, step, state, data_iterator):
    self.manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(_saved_fields(state)), data=grain.checkpoint.CheckpointSave(data_iterator)),
        force=True)

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

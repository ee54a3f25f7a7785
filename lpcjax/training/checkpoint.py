"""Orbax checkpoints of the train state. The only module that imports orbax."""

import os

import orbax.checkpoint as ocp


def save_state(run_dir, step, state):
  """Write ``state`` (params, optimizer state, step) under run_dir/checkpoints/<step>.

  Orbax writes into a temporary directory and renames it when complete, so an interrupted
  save never leaves a checkpoint that looks finished.
  """
  with ocp.CheckpointManager(os.path.abspath(os.path.join(run_dir, "checkpoints"))) as manager:
    manager.save(step, args=ocp.args.StandardSave(state))
    manager.wait_until_finished()


def restore_state(run_dir, abstract_state, step=None):
  """Restore into the structure (and shardings) of ``abstract_state``; latest step by default."""
  with ocp.CheckpointManager(os.path.abspath(os.path.join(run_dir, "checkpoints"))) as manager:
    step = manager.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {run_dir}/checkpoints")
    return manager.restore(step, args=ocp.args.StandardRestore(abstract_state))

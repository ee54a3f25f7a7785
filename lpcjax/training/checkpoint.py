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
from etils import epath


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


class TreeMismatchError(ValueError):
  """The saved state's tree differs from the model's; the message is one line."""


class IncompleteCheckpointError(ValueError):
  """A checkpoint step without an item a restore needs (a partial copy); one line."""


def _key_name(key):
  for attribute in ("key", "idx", "name"):  # DictKey, SequenceKey, GetAttrKey (namedtuples)
    if hasattr(key, attribute):
      return str(getattr(key, attribute))
  return str(key)


def _leaf_paths(tree):
  """{('params', 'layers', ...): leaf}: Orbax's metadata keeps namedtuples as dicts, so the
  paths of the two trees are compared by name."""
  return {tuple(_key_name(k) for k in path): leaf
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def compare_trees(saved, wanted):
  """A one-line description of how the ``saved`` tree (shapes) differs from the ``wanted`` one,
  or None: the first missing subtree (params first), else the first array of another shape."""
  have, want = _leaf_paths(saved), _leaf_paths(wanted)
  prefixes = lambda paths: {path[:i] for path in paths for i in range(1, len(path) + 1)}
  have_prefixes, want_prefixes = prefixes(have), prefixes(want)
  missing = set()
  for paths, others, side in ((want, have_prefixes, "the checkpoint lacks it"),
                              (have, want_prefixes, "the model has no such entry")):
    for path in paths:
      if path in others:
        continue
      first = next(path[:i] for i in range(1, len(path) + 1) if path[:i] not in others)
      missing.add((first[0] != "params", ".".join(first), side))
  if missing:
    _, path, side = min(missing)
    return (f"the checkpoint does not match the model built from config.json ({len(missing)} "
            f"differing entries; first: {path}: {side}); was it written by another version of the "
            "model code?")
  for path in sorted(want, key=lambda p: (p[0] != "params", p)):
    saved_shape, wanted_shape = tuple(have[path].shape), tuple(want[path].shape)
    if saved_shape != wanted_shape:
      return (f"the checkpoint does not match the model built from config.json (an array of "
              f"shape {saved_shape} where the model needs {wanted_shape}, {'.'.join(path)}); was "
              "it written by another version of the model code?")
  return None


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
    self._check_items(step, ("state", "data") if data_iterator is not None else ("state",))
    target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          abstract_state, shardings)
    self._check_tree(step, _saved_fields(target))
    items = {"state": ocp.args.StandardRestore(_saved_fields(target))}
    if data_iterator is not None:
      items["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
    return target.replace(**self.manager.restore(step, args=ocp.args.Composite(**items))["state"])

  def restore_variables(self, params, mutable, shardings, step=None):
    """(params, mutable collections) of checkpoint ``step`` (default: the latest) into
    ``shardings`` (a (params, mutable) pair), and nothing else: not the optimizer state, whose
    Adam moments would be two more copies of the parameters in memory (evaluation, generation
    and ``train.init_from`` need none; MaxText's load_parameters_path). Reads every checkpoint
    that holds a full state, old ones included."""
    step = self.latest_step() if step is None else step
    self._check_items(step, ("state",))
    abstract = {"params": params, **({"mutable": mutable} if mutable else {})}
    wanted = {"params": shardings[0], **({"mutable": shardings[1]} if mutable else {})}
    target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, wanted)
    self._check_tree(step, target)
    restore = ocp.args.PyTreeRestore(item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
                                     partial_restore=True)
    with ocp.PyTreeCheckpointer() as reader:
      restored = reader.restore(epath.Path(self.manager.directory) / str(step) / "state", args=restore)
    return restored["params"], restored.get("mutable", {})

  def _check_items(self, step, names):
    """IncompleteCheckpointError for a step folder that lacks one of the items ``names``
    (Orbax's own error is a page-long KeyError traceback)."""
    folder = epath.Path(self.manager.directory) / str(step)
    for name in names:
      if not (folder / name).is_dir():
        # a converted checkpoint (lpcjax.convert) is whole without a data position
        converted = ("a run converted by lpcjax.convert has none and cannot be resumed (start a new run from "
                     "its weights with train.init_from=RUN_DIR); " if name == "data" else "")
        raise IncompleteCheckpointError(
            f"checkpoint step {step} is incomplete: {folder} has no {name!r} item; {converted}a partial copy: "
            "copy the whole step folder again")

  def _check_tree(self, step, wanted):
    """TreeMismatchError before any array is read: a restore that fails half-way leaves Orbax's
    TensorStore reads running against a closed event loop, and their errors surface later, in
    whatever code runs next, as page-long 'Exception ignored' tracebacks."""
    handler = ocp.StandardCheckpointHandler()
    try:
      saved = handler.metadata(epath.Path(self.manager.directory) / str(step) / "state")
    except Exception:  # noqa: BLE001  no readable metadata (another layout): restore reports it
      return
    finally:
      handler.close()
    saved = getattr(saved, "tree", saved)
    if set(wanted) < set(saved):  # a partial restore: only the parts it reads are compared
      saved = {key: saved[key] for key in wanted}
    mismatch = compare_trees(saved, wanted)
    if mismatch:
      raise TreeMismatchError(mismatch)

  def close(self):
    """Wait for pending saves and release the manager; closing twice is harmless."""
    if self.manager is not None:
      manager, self.manager = self.manager, None
      try:
        manager.wait_until_finished()
      finally:  # a failed save still releases the manager's threads
        manager.close()

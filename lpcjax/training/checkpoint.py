"""Orbax checkpoints: train state and data-iterator state in one step. The only module that
imports orbax.

Each save writes <run_dir>/checkpoints/<step>/ with two items: ``state`` (params, optimizer
state, step, the model's mutable collections; sharded arrays written by every process) and ``data``
(the Grain iterator state).
Orbax writes into a temporary directory and renames it when complete, and refuses to write a
step that exists, so a failed or interrupted run never replaces a good checkpoint.
"""

import asyncio
import contextlib
import errno
import glob
import json
import logging
import os
import re
import shutil
import sys
import warnings

import grain
import jax
import orbax.checkpoint as ocp
from etils import epath

from lpcjax import cli
from lpcjax.errors import UserError
from lpcjax.files import REASONS


def checkpoint_dir(run_dir):
  return os.path.abspath(os.path.join(run_dir, "checkpoints"))


def checkpoint_steps(run_dir):
  """The checkpoint steps in ``run_dir``, ascending: the folders Orbax names by their step
  (it renames a step's folder to its number only when the step is complete)."""
  path = checkpoint_dir(run_dir)
  return sorted(int(name) for name in os.listdir(path) if name.isdigit()) if os.path.isdir(path) else []


def latest_checkpoint_step(run_dir):
  """The highest complete checkpoint step in ``run_dir``, or None."""
  return max(checkpoint_steps(run_dir), default=None)


def has_checkpoint(run_dir):
  return latest_checkpoint_step(run_dir) is not None


def saved_config(run_dir):
  """(step, config dict) of the latest checkpoint step that carries the run's config (each step
  saves it beside the state: Orbax's JSON item, one file named ``metadata``), or None (the
  steps of lpcjax before 2026-12-06 carry none). Plain JSON: no Orbax call."""
  for step in reversed(checkpoint_steps(run_dir)):
    try:
      with open(os.path.join(checkpoint_dir(run_dir), str(step), "config", "metadata")) as f:
        return step, json.load(f)
    except (OSError, ValueError):
      continue
  return None


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


class DamagedCheckpointError(ValueError):
  """A checkpoint step whose files cannot be read: deleted, truncated or without its metadata.
  The message is one line, naming the step and what could not be read."""


class CheckpointWriteError(UserError, OSError):
  """A checkpoint step that could not be written (a full disk, a quota, permissions); the
  message is one line, naming the step, the reason and the steps that stay whole."""


# What TensorStore says (through Orbax's threads) when a write fails for a reason the user can
# fix, as the errno whose words files.py gives at start-up: the disk or quota is full, the
# folder became read-only or unwritable.
_WRITE_FAILURES = tuple((needle, REASONS[number]) for needle, number in (
    ("No space left on device", errno.ENOSPC), ("Disk quota exceeded", errno.EDQUOT),
    ("Read-only file system", errno.EROFS), ("Permission denied", errno.EACCES)))


def _causes(error):
  """``error`` and the errors it was raised from or during, outermost first."""
  seen = []
  while error is not None and error not in seen:
    seen.append(error)
    error = error.__cause__ or error.__context__
  return seen


def _write_failure(error):
  """The reason a save failed, in words, or None for any other error (a bug keeps its traceback)."""
  text = " ".join(str(cause) for cause in _causes(error))
  return next((reason for needle, reason in _WRITE_FAILURES if needle in text), None)


class _FailedWriteFilter(logging.Filter):
  """Drops Orbax's records of a save its threads could not write (a page each, several per
  failed step): the trainer says it in one line (``CheckpointWriteError``)."""

  def filter(self, record):
    text = record.getMessage() + str(record.exc_info[1] if record.exc_info else "")
    return not any(needle in text for needle, _ in _WRITE_FAILURES)


logging.getLogger("absl").addFilter(_FailedWriteFilter())


# What TensorStore and Orbax say when a step's files are missing, cut short or corrupt.
_DAMAGE = re.compile(r"Error reading|Error opening|OCDBT|NOT_FOUND|DATA_LOSS|Truncated|corrupt|No such file|"
                     r"Unable to open|Failed to decode|unexpected end")


def _damage(error):
  """A short account of a restore that failed on unreadable files, or None for another error.
  The cause chain is searched for TensorStore's own line (``Error reading "params.x/0.0" in
  OCDBT database at ...: Truncated Zstd-compressed stream; ...``): the array and the reason."""
  for cause in _causes(error):
    text = str(cause)
    reading = re.search(r'Error reading "([^"/]+)[^"]*"[^:]*: ([^;\n]+)', text)
    if reading:  # the reason, without TensorStore's spec that may follow it
      return f"cannot read {reading[1]} ({reading[2].split(' [tensorstore_spec')[0].strip()[:160]})"
    if isinstance(cause, json.JSONDecodeError):  # the tree's metadata (_METADATA) cut short or garbled
      return f"its metadata is not valid JSON ({cause})"
    if isinstance(cause, FileNotFoundError):
      return f"a file is missing ({cause.filename or cause})"
    if _DAMAGE.search(text):
      return f"{type(cause).__name__}: {text.splitlines()[0][:160]}"
  return None


_CHECK_CLOSED = asyncio.BaseEventLoop._check_closed


def _late_read_check_closed(loop, original=_CHECK_CLOSED, frame=sys._getframe):
  """asyncio's closed-loop check, except for ``call_soon_threadsafe`` called from a thread
  with no Python frame below it (a TensorStore thread delivering a late read)."""
  caller = frame(1)
  if loop.is_closed() and caller.f_code.co_name == "call_soon_threadsafe" and caller.f_back is None:
    return
  original(loop)


class _ClosedLoopGuard:
  """While a restore runs or a Checkpointer is open (and for good once a read or a write
  failed), a TensorStore read or write that ends after Orbax closed its event loop calls
  ``loop.call_soon_threadsafe`` on the closed loop; its RuntimeError is printed as a traceback
  from TensorStore's threads, around the one-line error. Such a call is dropped instead: nobody
  waits for that result any more."""

  original = asyncio.BaseEventLoop.call_soon_threadsafe
  kept = False  # a restore or a save failed: the guard stays
  users = 0  # the blocks and open Checkpointers that asked for it

  @staticmethod
  def call_soon_threadsafe(loop, *args, original=original, **kwargs):
    if loop.is_closed():
      return None
    return original(loop, *args, **kwargs)

  @classmethod
  @contextlib.contextmanager
  def around(cls):
    """The guard while the block runs (and after it, once a restore failed)."""
    cls.install()
    try:
      yield
    finally:
      cls.remove()

  @classmethod
  def install(cls):
    cls.users += 1
    asyncio.BaseEventLoop.call_soon_threadsafe = cls.call_soon_threadsafe
    # TensorStore may hold a loop's call_soon_threadsafe from before this guard (taken when an
    # earlier read first awaited on that loop) and call that original from its own thread; the
    # closed-loop check it makes is looked up at call time, so that check lets such calls through.
    asyncio.BaseEventLoop._check_closed = _late_read_check_closed

  @classmethod
  def remove(cls):
    cls.users -= 1
    if not cls.kept and cls.users == 0:
      asyncio.BaseEventLoop.call_soon_threadsafe = cls.original
      asyncio.BaseEventLoop._check_closed = _CHECK_CLOSED


def _quiet_failed_reads():
  """After a restore failed on unreadable files (or a save on a full disk), the reads (writes) it
  had started still end, later and on other threads, each with a page of traceback: keep the
  closed-loop guard, drop Orbax's read coroutines collected with their exception ('Exception
  ignored in ...') and asyncio's records of them, for the rest of the process, and have the
  entry points skip the interpreter's teardown, where the last of them are freed and no hook
  can hold them back."""
  if _ClosedLoopGuard.kept:
    return
  _ClosedLoopGuard.kept = True
  original_hook = sys.unraisablehook

  # The names are bound here: the hook may run while the interpreter exits, after module
  # globals are gone, and a failing hook would print the very traceback it is to drop.
  def unraisable_hook(unraisable, reads=_ORBAX_READS, original=original_hook):
    if not str(getattr(unraisable.object, "__qualname__", "")).startswith(reads):
      original(unraisable)

  sys.unraisablehook = unraisable_hook
  # the tree check's metadata read, abandoned, is collected unawaited later
  warnings.filterwarnings("ignore", message="coroutine 'Store._get_array_metadatas' was never awaited",
                          category=RuntimeWarning)
  logging.getLogger("asyncio").addFilter(_FailedReadFilter())
  cli.skip_teardown()


_ORBAX_READS = ("_read_array_index",)  # the coroutines Orbax's restore runs per array shard


class _FailedReadFilter(logging.Filter):
  """Drops asyncio's 'exception was never retrieved' records of Orbax's failed reads."""

  def filter(self, record, reads=_ORBAX_READS):
    text = record.getMessage() + str(record.exc_info[1] if record.exc_info else "")
    return not ("never retrieved" in text and ("reading array index" in text or reads[0] in text))


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
    self.directory = checkpoint_dir(run_dir)
    self.manager = ocp.CheckpointManager(self.directory, options=options)
    _ClosedLoopGuard.install()  # an asynchronous save's writes may end after a failure closed the loop

  def latest_step(self):
    return self.manager.latest_step()

  def all_steps(self):
    return sorted(self.manager.all_steps())

  def save(self, step, state, data_iterator=None, config=None):
    """Save ``state``, and when given the data iterator's position (a converted checkpoint,
    ``lpcjax.convert``, has none: it can be evaluated and fine-tuned from, not resumed) and the
    run's config (a dict: ``config.json``'s copy, for a run that lost that file). Saves are
    asynchronous: a write that fails (a full disk) is found here at the next save, or by
    ``close``, and raised as a one-line CheckpointWriteError."""
    items = {"state": ocp.args.StandardSave(_saved_fields(state))}
    if data_iterator is not None:
      items["data"] = grain.checkpoint.CheckpointSave(data_iterator)
    if config is not None:
      items["config"] = ocp.args.JsonSave(config)
    with self._writing(step):
      self.manager.save(step, args=ocp.args.Composite(**items), force=True)

  @contextlib.contextmanager
  def _writing(self, step):
    """CheckpointWriteError for a save that failed on the file system (this step's, or an earlier
    one still being written), after removing its partial folder; the finished steps stay."""
    try:
      yield
    except Exception as error:  # noqa: BLE001  Orbax re-raises its threads' errors as they were
      reason = _write_failure(error)
      if reason is None:
        raise
      failed = re.search(r"checkpoints/(\d+)\.orbax-checkpoint-tmp", str(error))
      failed = int(failed[1]) if failed else step
      _quiet_failed_reads()  # its other writes end late, on a loop that is closed by then
      self._abandon()
      for partial in glob.glob(os.path.join(self.directory, "*.orbax-checkpoint-tmp*")):
        shutil.rmtree(partial, ignore_errors=True)
      whole = ", ".join(map(str, checkpoint_steps(os.path.dirname(self.directory))))
      kept = f"the steps before it stay whole ({whole})" if whole else "no step was saved before it"
      raise CheckpointWriteError(f"checkpoint step {failed} could not be written to {self.directory} ({reason}); its "
                                 f"partial folder was removed and {kept}: make room, then resume the run "
                                 "(--resume)") from None

  def _abandon(self):
    """Release the manager after a failed write without waiting on it again (it would raise the
    same error once more)."""
    manager, self.manager = self.manager, None
    if manager is not None:
      with contextlib.suppress(Exception):
        manager.close()

  def restore(self, abstract_state, shardings, data_iterator=None, step=None):
    """Restore the state into ``shardings`` (any mesh: Orbax reshards) and, given the data
    iterator, its position too (evaluation passes none). Latest step by default."""
    with _ClosedLoopGuard.around():  # the tree check's reads too: theirs may end late as well
      return self._restore(abstract_state, shardings, data_iterator, step)

  def _restore(self, abstract_state, shardings, data_iterator, step):
    step = self.latest_step() if step is None else step
    self._check_items(step, ("state", "data") if data_iterator is not None else ("state",))
    target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          abstract_state, shardings)
    self._check_tree(step, _saved_fields(target))
    items = {"state": ocp.args.StandardRestore(_saved_fields(target))}
    if data_iterator is not None:
      items["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
    restored = self._read(step, lambda: self.manager.restore(step, args=ocp.args.Composite(**items)))
    return target.replace(**restored["state"])

  def restore_variables(self, params, mutable, shardings, step=None):
    """(params, mutable collections) of checkpoint ``step`` (default: the latest) into
    ``shardings`` (a (params, mutable) pair), and nothing else: not the optimizer state, whose
    Adam moments would be two more copies of the parameters in memory (evaluation, generation
    and ``train.init_from`` need none; MaxText's load_parameters_path). Reads every checkpoint
    that holds a full state, old ones included."""
    with _ClosedLoopGuard.around():  # the tree check's reads too: theirs may end late as well
      return self._restore_variables(params, mutable, shardings, step)

  def _restore_variables(self, params, mutable, shardings, step):
    step = self.latest_step() if step is None else step
    self._check_items(step, ("state",))
    abstract = {"params": params, **({"mutable": mutable} if mutable else {})}
    wanted = {"params": shardings[0], **({"mutable": shardings[1]} if mutable else {})}
    target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, wanted)
    self._check_tree(step, target)
    restore = ocp.args.PyTreeRestore(item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
                                     partial_restore=True)
    with ocp.PyTreeCheckpointer() as reader:
      restored = self._read(step, lambda: reader.restore(epath.Path(self.manager.directory) / str(step) / "state",
                                                         args=restore))
    return restored["params"], restored.get("mutable", {})

  def _read(self, step, read):
    """``read()``, with a DamagedCheckpointError for files that cannot be read; any other
    error (a tree that differs from the model's: ``tree_mismatch``) as it is."""
    try:
      return read()
    except Exception as error:  # noqa: BLE001  TensorStore raises bare Exceptions
      detail = _damage(error)
      if detail is None:
        raise
      _quiet_failed_reads()  # at once: the reads still running end any moment
    raise DamagedCheckpointError(f"checkpoint step {step} is damaged: {detail}")

  def looks_whole(self, step):
    """Whether step ``step`` has every file a restore of its state opens first (its metadata,
    the OCDBT manifests) and no empty data file: a check of the files' presence, not of their
    contents, which only a read can tell."""
    try:
      self._check_items(step, ("state",))
    except (IncompleteCheckpointError, DamagedCheckpointError):
      return False
    folder = epath.Path(self.manager.directory) / str(step) / "state"
    data_files = [path for pattern in ("d/*", "ocdbt.process_*/d/*") for path in folder.glob(pattern)]
    return all(path.stat().length > 0 for path in data_files)

  def _check_items(self, step, names):
    """IncompleteCheckpointError for a step folder that lacks one of the items ``names``
    (Orbax's own error is a page-long KeyError traceback); DamagedCheckpointError for a state
    without the metadata a restore reads first (without ``_METADATA`` Orbax guesses the tree:
    lists for tuples, a page-long structure error)."""
    folder = epath.Path(self.manager.directory) / str(step)
    for name in names:
      if name == "state" and (folder / name).is_dir():
        shards = list((folder / name).glob("ocdbt.process_*"))  # an OCDBT store: a manifest for each
        needed = ("_METADATA", "manifest.ocdbt") if shards else ("_METADATA",)
        missing = [file for file in needed if not (folder / name / file).exists()]
        missing += [f"{shard.name}/manifest.ocdbt" for shard in shards if not (shard / "manifest.ocdbt").exists()]
        if missing:
          raise DamagedCheckpointError(f"checkpoint step {step} is damaged: its state has no {missing[0]}")
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
    """Wait for pending saves and release the manager; closing twice is harmless. A pending save
    that failed on the file system raises CheckpointWriteError (see ``save``)."""
    if self.manager is None:
      return
    try:
      with self._writing(self.manager.latest_step()):
        self.manager.wait_until_finished()
    finally:  # a failed save still releases the manager's threads
      if self.manager is not None:
        manager, self.manager = self.manager, None
        manager.close()
      _ClosedLoopGuard.remove()

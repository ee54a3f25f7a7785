"""Small file helpers shared by the command lines, the trainer and the benchmark scripts:
atomic JSON, and the one-line account of file-system trouble. Standard library only, so that a
command line checks its paths before JAX is imported."""

import errno
import json
import os
import tempfile

from lpcjax.errors import RunError, UserError


class FileSystemError(UserError, OSError):
  """A folder that cannot be created or written (permissions, a full disk, a file in its place)."""


# errno -> the words a one-line error gives (at start-up here, and for a checkpoint the disk
# could not take in lpcjax.training.checkpoint)
REASONS = {errno.EACCES: "no permission to write there", errno.EPERM: "no permission to write there",
           errno.EROFS: "a read-only file system", errno.ENOSPC: "no space left on the device",
           errno.EDQUOT: "over the disk quota", errno.ENOTDIR: "a file stands where a folder is needed",
           errno.EEXIST: "a file stands where a folder is needed"}


def filesystem_problem(error, path, way_out):
  """A FileSystemError of one line for ``error`` (an OSError met at ``path``), ending with
  ``way_out`` (e.g. "choose another folder with --out DIR")."""
  reason = REASONS.get(error.errno, error.strerror or type(error).__name__)
  return FileSystemError(f"cannot write {error.filename or path}: {reason}; {way_out}")


def check_run_path(run_dir):
  """A one-line RunError for a path that cannot be a run directory: not there, or a file (for a
  run's config.json, naming its folder). Standard library only: the command lines call it
  before JAX is imported; what the folder holds is checked when the run is read."""
  if not os.path.exists(run_dir):
    raise RunError(f"{run_dir}: no such folder (a run directory is train.run_dir/train.run_name, e.g. runs/NAME)")
  if not os.path.isdir(run_dir):
    parent = os.path.dirname(os.path.abspath(run_dir))
    hint = (f"; its folder {parent} is the run directory" if os.path.basename(run_dir) == "config.json"
            and os.path.isdir(os.path.join(parent, "checkpoints")) else "")
    raise RunError(f"{run_dir} is a file, not a run directory{hint}")


def check_writable(folder, way_out):
  """FileSystemError (see ``filesystem_problem``) unless a file can be created in ``folder``, or
  for a folder yet to be made, in the nearest folder above it that exists; tried with a
  temporary file, removed at once, so nothing is left behind (root passes a permission check
  that a real write would pass too)."""
  existing = os.path.abspath(folder)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise filesystem_problem(OSError(errno.ENOTDIR, "Not a directory", folder), folder, way_out)
  try:
    with tempfile.TemporaryFile(dir=existing):
      pass
  except OSError as error:
    raise filesystem_problem(OSError(error.errno, error.strerror, folder), folder, way_out) from None


def write_json_atomic(path, obj):
  """Write obj as JSON to path via a temporary file and a rename: readers (and a run killed
  mid-write) see the old file or the new one, never half of one. Creates the parent folder."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2, sort_keys=True)
  os.replace(tmp, path)

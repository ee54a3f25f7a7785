"""Hugging Face model directories on disk: config.json and the weights, read and written.

Weights are read from ``*.safetensors`` (one file or the shards of a sharded save) through the
safetensors package, which needs no torch; a directory holding only PyTorch ``*.bin`` files
needs torch. Tensors come back as float32 numpy arrays whatever they were stored as (bfloat16
widens exactly). Directories are written under a temporary name beside the target and renamed
when complete, so a failed or interrupted conversion never leaves half a model behind.
"""

import contextlib
import glob
import json
import os
import shutil
import tempfile

import numpy as np

from lpcjax.errors import UserError


class ConvertError(UserError, ValueError):
  """A checkpoint that lpcjax cannot convert: an option it does not have, a missing or
  unexpected tensor, a file it cannot read. The message is one line naming the cause."""


def read_config(directory):
  path = os.path.join(directory, "config.json")
  if not os.path.isfile(path):
    raise ConvertError(f"{directory}: no config.json (not a Hugging Face model directory)")
  with open(path) as f:
    return json.load(f)


def _safetensors(paths):
  try:
    from safetensors import safe_open
  except ImportError:
    raise ConvertError("reading .safetensors needs the safetensors package (pip install safetensors)") from None
  tensors = {}
  for path in paths:
    # The "flax" view reads bfloat16 too (the numpy view cannot); it lands on the default device
    # once per tensor and comes straight back to host memory.
    with safe_open(path, framework="flax") as f:
      for name in f.keys():
        tensors[name] = np.asarray(f.get_tensor(name), dtype=np.float32)
  return tensors


def _torch_bins(paths):
  try:
    import torch
  except ImportError:
    raise ConvertError(f"{os.path.dirname(paths[0])} holds PyTorch .bin weights, which need torch to read "
                       "(pip install torch), or save the model as safetensors") from None
  tensors = {}
  for path in paths:
    state = torch.load(path, map_location="cpu", weights_only=True)
    tensors.update({name: t.detach().float().numpy() for name, t in state.items()})
  return tensors


def _weight_files(directory, stem, suffix):
  """The files of one saved model: those an index names (sharded save), else STEM*.SUFFIX."""
  index = os.path.join(directory, f"{stem}.{suffix}.index.json")
  if os.path.isfile(index):
    with open(index) as f:
      return sorted({os.path.join(directory, name) for name in json.load(f)["weight_map"].values()})
  return sorted(glob.glob(os.path.join(directory, f"{stem}*.{suffix}")))


def read_weights(directory):
  """{tensor name: float32 array} of the model saved in ``directory`` (``model*.safetensors``,
  else ``pytorch_model*.bin``; sharded saves through their index)."""
  safetensors = _weight_files(directory, "model", "safetensors")
  if safetensors:
    return _safetensors(safetensors)
  bins = _weight_files(directory, "pytorch_model", "bin")
  if bins:
    return _torch_bins(bins)
  raise ConvertError(f"{directory}: no model*.safetensors or pytorch_model*.bin weights")


def write_model(directory, config, tensors):
  """config.json and model.safetensors (float32) into ``directory`` (which exists)."""
  from safetensors.numpy import save_file
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(config, f, indent=2, sort_keys=True)
  save_file({name: np.ascontiguousarray(t, dtype=np.float32) for name, t in tensors.items()},
            os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})


def _ordinary_permissions(root):
  """mkdtemp makes its folder 0700 and some writers their files 0600 (private temporary files);
  the finished directory gets what a plain mkdir/open would have: 0777/0666 less the umask."""
  umask = os.umask(0)
  os.umask(umask)
  for folder, _, files in os.walk(root):
    os.chmod(folder, 0o777 & ~umask)
    for name in files:
      path = os.path.join(folder, name)
      if not os.path.islink(path):
        os.chmod(path, 0o666 & ~umask)


@contextlib.contextmanager
def staged_directory(target, force, looks_replaceable):
  """Yield an empty temporary directory beside ``target``; on success it becomes ``target``.

  An existing ``target`` is an error unless ``force``; even then it is replaced only when it is
  empty or ``looks_replaceable(target)`` (what this tool writes), so that a mistyped path cannot
  delete an unrelated folder. On failure the temporary directory is removed and ``target`` is
  untouched.
  """
  target = os.path.abspath(target)
  if os.path.lexists(target):
    if not force:
      raise ConvertError(f"{target} exists; pass --force to replace it")
    if not os.path.isdir(target) or (os.listdir(target) and not looks_replaceable(target)):
      raise ConvertError(f"{target} exists and is not what this tool writes; not replacing it")
  parent = os.path.dirname(target)
  os.makedirs(parent, exist_ok=True)
  staging = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.tmp-", dir=parent)
  try:
    yield staging
    _ordinary_permissions(staging)
    if os.path.lexists(target):  # move the old one aside first: target is never half written
      old = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.old-", dir=parent)
      os.rename(target, os.path.join(old, "x"))
      os.rename(staging, target)
      shutil.rmtree(old, ignore_errors=True)
    else:
      os.rename(staging, target)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise

"""Which chip the kernels are built for: this machine's accelerator, or one that is absent.

Normally the kernels run where they are traced, and ``jax.default_backend()`` names the
platform. An ahead-of-time compile for a chip that is not here (``lpcjax.aot``: an H100 or a
TPU v5e described to JAX on a CPU machine) traces on the CPU but lowers and compiles for the
target. It names the target with ``building_for(device)``, one of the target's compile-only
devices; making that device the default device (``jax.default_device``, JAX's own recipe for
such compiles) names it too. Every backend asks here, so that "auto", the platform checks and
the kernels' launch parameters follow the target.
"""

import contextlib
import contextvars
import functools
import os
import re
import shutil
import subprocess

import jax

ACCELERATORS = ("gpu", "tpu")
_BUILDING_FOR = contextvars.ContextVar("lpcjax_kernels_building_for", default=None)


@contextlib.contextmanager
def building_for(device):
  """Build the kernels for ``device`` (a compile-only device of an absent chip) within this
  context. Unlike making it JAX's default device, this leaves eager computations (an
  optimizer's initial state, host-side constants) on this machine, where they can run."""
  token = _BUILDING_FOR.set(device)
  try:
    yield device
  finally:
    _BUILDING_FOR.reset(token)


def target_device():
  """The accelerator device the kernels are built for: ``building_for``'s, else the default
  device when one is set to an accelerator, else None (this machine's own devices)."""
  device = _BUILDING_FOR.get()
  if device is None:
    device = jax.config.jax_default_device
  return device if getattr(device, "platform", None) in ACCELERATORS else None


def target_platform():
  """"gpu", "tpu" or "cpu": the platform the kernels are compiled for."""
  device = target_device()
  return device.platform if device is not None else jax.default_backend()


def compute_capability():
  """The target GPU's compute capability as a string ("9.0"), or None when it is not known
  (no GPU targeted, or a device that does not report one)."""
  device = target_device()
  if device is None:
    if jax.default_backend() != "gpu":
      return None
    device = jax.devices()[0]
  capability = getattr(device, "compute_capability", None)
  return None if capability is None else str(capability)


@functools.cache
def ptxas_version():
  """(major, minor, patch) of the ptxas that XLA assembles GPU kernels with (Pallas on Triton,
  jax-triton's PTX, Mosaic GPU): under jax's CUDA path (``CUDA_ROOT``, or the pip package
  nvidia-cuda-nvcc), else the first on PATH; None when there is none (then the compile itself
  fails, naming it). Read once per process."""
  from jax._src import lib  # jax's own lookup of the CUDA tools, which it hands to XLA
  candidates = [os.path.join(lib.cuda_path, "bin", "ptxas")] if getattr(lib, "cuda_path", None) else []
  path = next((c for c in candidates if os.access(c, os.X_OK)), None) or shutil.which("ptxas")
  if path is None:
    return None
  printed = subprocess.run([path, "--version"], capture_output=True, text=True, check=False).stdout
  found = re.search(r"V(\d+)\.(\d+)\.(\d+)", printed)
  return tuple(map(int, found.groups())) if found else None


def ptx_isa_version():
  """The newest PTX ISA that ``ptxas_version()`` assembles, as Triton numbers it (88 for 8.8),
  or None: CUDA 12.0-12.5 take ISA 8.0-8.5, 12.6 still 8.5, 12.7-12.9 take 8.6-8.8, CUDA 13.x 9.x
  (NVIDIA's PTX ISA release notes)."""
  version = ptxas_version()
  if version is None:
    return None
  major, minor = version[:2]
  if major == 12:
    return 80 + minor - (minor >= 6)
  return 90 + 10 * (major - 13) + minor if major >= 13 else None

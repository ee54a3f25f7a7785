"""Where and how a benchmark writes its JSON: benchmarks/results/<name>_<backend>.json (or the
path given), with the backend, device, machine and jax version beside the figures."""

import os
import platform

import jax

from lpcjax.files import write_json_atomic


def write_results(name, figures, path=None, quiet=False):
  backend = jax.default_backend()
  path = path or os.path.join(os.path.dirname(__file__), "results", f"{name}_{backend}.json")
  write_json_atomic(path, {"backend": backend, "device": str(jax.devices()[0]), "machine": platform.node(),
                           "jax": jax.__version__, **figures})
  if not quiet:
    print(f"wrote {path}")
  return path

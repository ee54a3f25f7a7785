"""A non-editable wheel installs ``kernels/`` as ``lpcjax.kernels`` and no top-level ``kernels``."""

import os
import subprocess
import sys
import zipfile

from conftest import REPO


def test_wheel_maps_kernels_into_lpcjax(tmp_path):
  subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                  "-w", str(tmp_path / "wheel"), str(REPO)], check=True)
  (wheel,) = (tmp_path / "wheel").glob("lpcjax-*.whl")
  names = zipfile.ZipFile(wheel).namelist()
  assert "lpcjax/kernels/__init__.py" in names and "lpcjax/kernels/xla_blockwise.py" in names
  assert not any(name.startswith("kernels/") for name in names)
  site = tmp_path / "site"
  zipfile.ZipFile(wheel).extractall(site)
  # Import from the unpacked wheel only (not the checkout), from a directory outside the repo.
  code = ("import lpcjax, lpcjax.kernels, lpcjax.models, lpcjax.training, lpcjax.convert; "
          "assert lpcjax.kernels.__file__.startswith(%r); print(lpcjax.kernels.available_impls())" % str(site))
  env = {**os.environ, "PYTHONPATH": str(site), "PYTHONSAFEPATH": "1"}
  out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True)
  assert out.returncode == 0, out.stderr
  assert "xla" in out.stdout

"""A non-editable wheel installs ``kernels/`` as ``lpcjax.kernels`` and no top-level ``kernels``,
the named experiments as ``lpcjax.configs``, and the console scripts that train, evaluate and
generate without the checkout."""

import json
import os
import site
import subprocess
import sys
import sysconfig
import zipfile

import pytest

from conftest import REPO


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
  folder = tmp_path_factory.mktemp("wheel")
  subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                  "-w", str(folder), str(REPO)], check=True)
  (built,) = folder.glob("lpcjax-*.whl")
  return built


def test_wheel_maps_kernels_into_lpcjax(wheel, tmp_path):
  names = zipfile.ZipFile(wheel).namelist()
  assert "lpcjax/kernels/__init__.py" in names and "lpcjax/kernels/xla_blockwise.py" in names
  assert "lpcjax/configs/fox_tiny_mqar.py" in names and "lpcjax/data/gpt2.tiktoken.gz" in names
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


def test_an_installed_wheel_trains_evaluates_and_generates_outside_the_checkout(wheel, tmp_path):
  """A fresh virtual environment holding the wheel (its dependencies from this one, by a .pth
  line: their folder is read, not its .pth files, so the checkout's editable lpcjax is not seen),
  used from a folder that is not the checkout: lpcjax-train runs a named experiment (the default
  job, then paper:... printed), lpcjax-eval and lpcjax-generate read the run."""
  venv = tmp_path / "venv"
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
  bin_dir = venv / ("Scripts" if os.name == "nt" else "bin")
  purelib = subprocess.run([str(bin_dir / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           capture_output=True, text=True, check=True).stdout.strip()
  ours = {sysconfig.get_paths()["purelib"], *site.getsitepackages()}
  with open(os.path.join(purelib, "dependencies.pth"), "w") as f:
    f.write("\n".join(sorted(ours)) + "\n")
  subprocess.run([sys.executable, "-m", "pip", "--python", str(bin_dir / "python"), "install", "-q", "--no-deps",
                  str(wheel)], check=True)
  work = tmp_path / "elsewhere"
  work.mkdir()
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
  command = lambda name, *args: subprocess.run([str(bin_dir / name), *args], cwd=work, env=env, capture_output=True,
                                               text=True, timeout=600)
  where = command("python", "-c", "import lpcjax.configs, lpcjax.kernels; print(lpcjax.configs.__file__)")
  assert where.returncode == 0 and where.stdout.startswith(purelib), where.stderr

  trained = command("lpcjax-train", "train.steps=2", "train.warmup_steps=1", "train.eval_batches=1",
                    "train.run_name=tiny", "train.run_dir=runs")
  assert trained.returncode == 0, trained.stderr[-3000:]
  assert "lpcjax-train train.steps=2" in trained.stdout  # the resume command names the console script
  assert json.load(open(work / "runs" / "tiny" / "summary.json"))["step"] == 2
  printed = command("lpcjax-train", "--config", "paper:fox_125m", "--print-config")
  assert printed.returncode == 0 and json.loads(printed.stdout)["model"]["d_model"] == 768, printed.stderr
  helped = command("lpcjax-train", "--help")  # its examples are written for the console script
  assert "lpcjax-train --config fox_tiny_text data.train_files=book.txt" in helped.stdout
  assert not any(line.strip().startswith("python train.py") for line in helped.stdout.splitlines())
  assert "``lpcjax-train`` (installed), or ``python train.py`` in a checkout" in helped.stdout  # says both
  assert "lpcjax/config.py" not in helped.stdout
  text = command("lpcjax-train", "--config", "fox_tiny_text", "data.train_files=book.txt", "--print-config")
  assert text.returncode == 0 and json.loads(text.stdout)["data"]["train_files"] == ["book.txt"], text.stderr
  evaluated = command("lpcjax-eval", "--run", "runs/tiny", "--max-sequences", "8")
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  assert json.load(open(work / "runs" / "tiny" / "eval" / "per_token.json"))["num_sequences"] == 8
  generated = command("lpcjax-generate", "--run", "runs/tiny", "--token-ids", "1,2,3", "--max-new-tokens", "2")
  assert generated.returncode == 0 and len(generated.stdout.split()) == 5, generated.stderr[-3000:]

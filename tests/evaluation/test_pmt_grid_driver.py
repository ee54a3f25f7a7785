"""benchmarks/pmt_pretraining.py fills a grid in parts: the cells already in its --out file,
measured with the same settings, are reused (no training) and kept in the new table; a file of
other settings is a one-line error. Read on the committed Wafer cue grid."""

import importlib.util
import json
import shlex
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STORED = REPO / "benchmarks" / "results" / "pmt_grid_cue_cpu.json"


@pytest.fixture
def driver(monkeypatch):
  monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # its `from results_file import ...`
  spec = importlib.util.spec_from_file_location("pmt_pretraining", REPO / "benchmarks" / "pmt_pretraining.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  monkeypatch.setattr(module, "run_one", lambda *cell: pytest.fail(f"trained {cell}: should have been reused"))
  return module


def stored_arguments(out):
  argv = shlex.split(json.loads(STORED.read_text())["command"])[1:]
  return argv[:argv.index("--out")] + ["--out", str(out)]


def test_the_out_file_supplies_finished_cells(driver, tmp_path, capsys):
  out = tmp_path / "grid.json"
  shutil.copy(STORED, out)
  before = json.loads(out.read_text())
  argv = stored_arguments(out)
  start = argv.index("--seeds") + 1
  end = next(i for i in range(start, len(argv)) if argv[i].startswith("--"))
  argv[start:end] = ["1"]  # one of the stored seeds
  driver.main(argv)
  after = json.loads(out.read_text())
  assert "reused from" in capsys.readouterr().out
  key = lambda r: (r["set"], r["variant"], r["seed"])
  assert sorted(map(key, after["runs"])) == sorted(map(key, before["runs"]))  # seed 0 kept, not dropped
  for row, entry in before["table"]["Wafer"].items():
    for gap, cell in entry["cue"].items():
      assert after["table"]["Wafer"][row]["cue"][gap]["per_seed"] == cell["per_seed"]


def test_a_file_of_other_settings_is_a_one_line_error(driver, tmp_path):
  out = tmp_path / "grid.json"
  shutil.copy(STORED, out)
  argv = stored_arguments(out)
  argv[argv.index("--steps") + 1] = "150"
  with pytest.raises(SystemExit, match=r"other settings: --steps 1500 \(now 150\)"):
    driver.main(argv)
  assert json.loads(out.read_text()) == json.loads(STORED.read_text())  # untouched

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
  monkeypatch.setattr(module, "run_one", lambda *cell: pytest.fail(f"trained {cell}: nothing should train"))
  return module


def stored_arguments(out):
  argv = shlex.split(json.loads(STORED.read_text())["command"])[1:]
  return argv[:argv.index("--out")] + ["--out", str(out)]


def test_the_out_file_supplies_finished_cells(driver, tmp_path, monkeypatch, capsys):
  """Seed 0 is taken out of a copy of the file and 'trained' again (its stored result stands in for
  the run); seeds 1 and 2 come from the file. The table must be the file's, seed by seed."""
  full = json.loads(STORED.read_text())
  key = lambda r: (r["set"], r["variant"], r["seed"])
  original = {key(r): result for r, result in zip(full["runs"], full["results"])}
  part = dict(full, runs=[r for r in full["runs"] if r["seed"] != 0],
              results=[res for r, res in zip(full["runs"], full["results"]) if r["seed"] != 0])
  out = tmp_path / "grid.json"
  out.write_text(json.dumps(part))
  trained = []
  monkeypatch.setattr(driver, "run_one", lambda args, *cell: trained.append(cell) or original[cell])
  argv = stored_arguments(out)
  start = argv.index("--seeds") + 1
  end = next(i for i in range(start, len(argv)) if argv[i].startswith("--"))
  argv[start:end] = ["0", "1", "2"]
  driver.main(argv)
  after = json.loads(out.read_text())
  assert sorted(trained) == sorted(c for c in original if c[2] == 0)  # only the missing seed
  assert "reused from" in capsys.readouterr().out
  assert sorted(map(key, after["runs"])) == sorted(original)
  assert after["commands"][:-1] == part.get("commands", [part["command"]]) and after["settings"]["steps"] == 1500
  for row, entry in full["table"]["Wafer"].items():
    for gap, cell in entry["cue"].items():
      assert after["table"]["Wafer"][row]["cue"][gap]["per_seed"] == cell["per_seed"]  # in seed order
      assert after["table"]["Wafer"][row]["cue"][gap]["seeds"] == [0, 1, 2]
  driver.main(argv)  # again: the settings now come from the file's own "settings", and nothing trains
  assert len(trained) == len([c for c in original if c[2] == 0])
  argv[argv.index("--steps") + 1] = "150"
  with pytest.raises(SystemExit, match=r"other settings: --steps 1500 \(now 150\)"):
    driver.main(argv)


def test_a_file_of_other_settings_is_a_one_line_error(driver, tmp_path):
  out = tmp_path / "grid.json"
  shutil.copy(STORED, out)
  argv = stored_arguments(out)
  argv[argv.index("--steps") + 1] = "150"
  with pytest.raises(SystemExit, match=r"other settings: --steps 1500 \(now 150\)"):
    driver.main(argv)
  assert json.loads(out.read_text()) == json.loads(STORED.read_text())  # untouched


def test_a_run_directory_of_another_length_is_a_one_line_error(driver, tmp_path, monkeypatch):
  """A cell whose run directory holds a run of other steps (an old --run-dir) is refused, not tabled."""
  full = json.loads(STORED.read_text())
  monkeypatch.setattr(driver, "run_one", lambda args, *cell: dict(full["results"][0], step=150))
  argv = stored_arguments(tmp_path / "grid.json")
  with pytest.raises(SystemExit, match="was trained for 150 steps, not --steps 1500"):
    driver.main(argv)
  assert not (tmp_path / "grid.json").exists()


def test_the_table_has_macro_f1_beside_accuracy(driver, capsys):
  """Each linear cell of the table carries the seeds' macro-F1 (what an unbalanced set is read by) as
  the probes measured it, and its mean; the printed table lists it per seed. Read on the Strawberry grid."""
  stored = json.loads((REPO / "benchmarks" / "results" / "pmt_grid_Strawberry_cpu.json").read_text())
  results = {(r["set"], r["variant"], r["seed"]): res for r, res in zip(stored["runs"], stored["results"])}
  table = driver.summarize(results)
  for (name, variant, seed), result in results.items():
    for f, measured in result["linear"]["fractions"].items():
      cell = table[name][variant]["fractions"][f]
      assert cell["macro_f1_per_seed"][cell["seeds"].index(seed)] == measured["macro_f1"]
      assert cell["macro_f1"] == pytest.approx(sum(cell["macro_f1_per_seed"]) / len(cell["seeds"]))
      assert 0 < cell["macro_f1"] <= 1 and cell["macro_f1"] != cell["accuracy"]
  driver.print_table(table, results, [0.01, 0.05, 1.0])
  assert "probe macro-F1 per pre-training seed, pmt: 1% " in capsys.readouterr().out


def test_a_set_missing_from_the_ucr_folder_is_a_one_line_error(driver, tmp_path):
  with pytest.raises(SystemExit, match=r"Wafer_TRAIN.tsv.gz: no such file \(--ucr-dir .* has no set Wafer\)"):
    driver.main(["--sets", "Wafer", "--controls-only", "--ucr-dir", str(tmp_path),
                 "--out", str(tmp_path / "controls.json")])
  assert not (tmp_path / "controls.json").exists()

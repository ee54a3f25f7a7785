"""The GPU session's scripts off the GPU: the shared inputs, the peers' float64 check (fla and
PyTorch SDPA in Triton's interpreter, as gpu_check.sh's rehearsal runs them) and the report's
ratios, on rows whose answer is known."""

import importlib.util
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


def benchmark_module(monkeypatch, name):
  monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # their sibling imports
  spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_the_static_measures_cost_model_takes_the_larger_of_issue_and_tensor_clocks(monkeypatch):
  """benchmarks/mosaic_gpu_static.py's model, on counts of version 1's and the hardware path's
  kernels at D = 128 from an earlier build: version 1's four kernels are bound by issue,
  822 + 715 + 834 + 1159 clocks; the hardware path's 128-key forward (two 64 x 64 a trip) and
  one-kernel backward by their tensor clocks: 512 alone, 768 + 1280 in a training step."""
  static = benchmark_module(monkeypatch, "mosaic_gpu_static")
  kernel = lambda path, name, units, instructions: {"path": path, "head_dim": 128, "setting": "plain",
                                                    "kernel": f"forgetting_attention_mgpu_{name}", "units": units,
                                                    "instructions": instructions}
  entries = [kernel("v1", "fwd", 2, 822), kernel("v1", "row_term", 2, 715), kernel("v1", "dq", 3, 834),
             kernel("v1", "dkv", 4, 1159), kernel("v2 hw", "fwd_hw", 4, 596),
             kernel("v2 hw", "fwd_two_part_hw", 6, 785), kernel("v2 hw", "dkv_dq_hw", 5, 1100)]
  for entry in entries:
    entry["model"] = static.model(entry, 128)
  assert entries[4]["model"] == {"issue_clocks": 298.0, "tensor_clocks": 512.0, "clocks": 512.0, "bound": "tensor"}
  assert entries[3]["model"]["bound"] == "issue" and entries[3]["model"]["clocks"] == 1159
  version_1, hardware = static.model_steps(entries)
  assert version_1["training_step_clocks"] == 3530 and version_1["forward_clocks"] == 822
  assert hardware["training_step_clocks"] == 768 + 1280 and hardware["forward_clocks"] == 512
  assert hardware["training_step_vs_v1"] == pytest.approx(2048 / 3530, abs=1e-3)
  entries.pop(0)  # version 1's forward failed to compile: no ratio, no error
  assert "forward_vs_v1" not in static.model_steps(entries)[1]


@pytest.mark.parametrize("tau", [32.0, 2048.0])
def test_timescale_gates_decay_by_one_over_e_in_tau_steps(monkeypatch, tau):
  inputs = benchmark_module(monkeypatch, "attention_inputs")
  log_f = inputs.attention_inputs(2, 4096, 2, 8, gate_timescale=tau)["log_f"]
  assert log_f.dtype == np.float32 and np.all(log_f < 0)
  # the noise is symmetric around the bias, so the median gate is sigmoid(b) = exp(-1/tau)
  np.testing.assert_allclose(np.median(log_f), -1 / tau, rtol=0.05)


def row(candidate, ms, seq_len=16384, head_dim=128, tau=None, **extra):
  return {"candidate": candidate, "seq_len": seq_len, "head_dim": head_dim, "gate_timescale": tau,
          "forward_ms": ms / 3, "forward_backward_ms": ms, "forward_tflops": 1.0,
          "forward_backward_tflops": 100.0 / ms, **extra}


def test_report_ratios_are_time_ratios_against_the_best_gated_peer_the_floor_and_xla(monkeypatch, tmp_path):
  report = benchmark_module(monkeypatch, "gpu_report")
  ours = {"rows": [row("pallas", 10.0), row("xla", 40.0), row("cudnn_nobias", 5.0),
                   {"candidate": "triton", "seq_len": 16384, "head_dim": 128, "error": "no jax-triton"}]}
  peers = {"rows": [row("fla", 15.0), row("fox_official", 20.0), row("sdpa_flash", 4.0)]}
  pruning = {"rows": [row("pallas", 10.0, tau=32.0), row("pallas_pruned", 4.0, tau=32.0, skipped_tile_fraction=0.8)]}
  for name, content in (("attention_gpu_16k", ours), ("attention_peers_gpu_16k", peers),
                        ("attention_pruning_gpu", pruning)):
    (tmp_path / f"{name}.json").write_text(json.dumps(content))
  archive = tmp_path / "gpu_results.tar"
  with tarfile.open(archive, "w") as tar:  # the form a device session returns
    for path in tmp_path.glob("*.json"):
      tar.add(path, arcname=path.name)
  monkeypatch.setattr(sys, "argv", ["gpu_report.py", str(archive), "--json", str(tmp_path / "ratios.json")])
  report.main()
  ratios = json.loads((tmp_path / "ratios.json").read_text())
  pallas = next(r for r in ratios["attention"] if r["kernel"] == "pallas")
  assert pallas["best_peer"] == "fla"
  assert pallas["vs_best_peer"] == pytest.approx(1.5)  # fla 15 ms / pallas 10 ms
  assert pallas["vs_cudnn_floor"] == pytest.approx(0.5)
  assert pallas["vs_xla"] == pytest.approx(4.0)
  assert [r["kernel"] for r in ratios["attention"]] == ["pallas", "xla"]  # the errored triton row has none
  (pruned,) = ratios["pruning"]
  assert pruned["speedup"] == pytest.approx(2.5) and pruned["skipped_tile_fraction"] == 0.8


def test_peers_agree_with_float64_in_the_triton_interpreter(tmp_path):
  pytest.importorskip("torch", reason="needs torch: pip install -e '.[peer]'")
  pytest.importorskip("fla", reason="needs flash-linear-attention: pip install -e '.[peer]'")
  out = tmp_path / "peers.json"
  # a fresh process: the interpreter must be switched on before triton is first imported
  subprocess.run([sys.executable, str(REPO / "benchmarks" / "attention_peers.py"), "--interpret", "--dtype",
                  "float16", "--seq-lens", "64", "--head-dims", "32", "--batch-tokens", "64", "--model-dim", "64",
                  "--iters", "1", "--check-len", "48", "--impls", "fla", "fox_official", "sdpa_flash",
                  "--official", str(tmp_path / "absent.py"), "--out", str(out)],
                 check=True, capture_output=True, cwd=tmp_path)
  result = json.loads(out.read_text())
  fla, sdpa = result["checks"]["fla"], result["checks"]["sdpa_flash"]
  assert set(fla) == {"o", "dq", "dk", "dv", "dlog_f"} and max(fla.values()) < 3e-3  # float16 inputs
  assert set(sdpa) == {"o", "dq", "dk", "dv"} and max(sdpa.values()) < 3e-3
  assert "no official kernel at" in result["checks"]["fox_official"]["error"]
  timed = {r["candidate"]: r for r in result["rows"]}
  assert timed["fla"]["forward_backward_ms"] > 0 and "no official kernel" in timed["fox_official"]["skipped"]

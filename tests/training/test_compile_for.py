"""train.py --compile-for on real compilers (CI's Python 3.12 leg: the [aot] extra): a tiny
config's step compiled for a small GPU target and a small TPU target, the plan printed and
written as JSON, nothing else written; a mesh or backend the target cannot hold is one line."""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

pytest.importorskip("jax_plugins.xla_cuda12", reason="needs the [aot] extra (Python >= 3.12)")
pytest.importorskip("libtpu", reason="needs the [aot] extra (Python >= 3.12)")

TINY = ["model.vocab_size=64", "data.mqar_vocab_size=64", "data.mqar_num_pairs=4", "data.seq_len=64",
        "data.batch_size=8", "model.d_model=64", "model.mlp_multiple_of=32"]


def compile_for(tmp_path, target, *overrides):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
  return subprocess.run([sys.executable, str(REPO / "train.py"), "--compile-for", target, "--json",
                         str(tmp_path / "plan.json"), *TINY, *overrides], capture_output=True, text=True,
                        cwd=tmp_path, env=env, timeout=900)


@pytest.mark.parametrize("target, mesh, collective", [("h100x2", "mesh data 2 x fsdp 1", "all-reduce"),
                                                      ("v5e-4", "mesh data 1 x fsdp 4", "all-gather")])
def test_a_tiny_step_compiled_for_a_small_target_prints_its_plan(tmp_path, target, mesh, collective):
  overrides = ["train.mesh_data=1", "train.mesh_fsdp=4"] if target.startswith("v5e") else []
  result = compile_for(tmp_path, target, *overrides)
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stdout.strip().splitlines()
  assert [line[:9] for line in lines[:6]] == ["target   ", "state    ", "step     ", "total    ", "flops    ",
                                              "comms    "]
  assert f"{target}: " in lines[0] and mesh in lines[0] and "fits," in lines[3] and collective in lines[5]
  plan = json.load(open(tmp_path / "plan.json"))["plan"]
  assert plan["fits"] and plan["total"] == (plan["arguments"] + plan["outputs"] + plan["temporaries"]
                                            - plan["aliased"] + plan["code"])
  assert plan["params"] > 0 and plan["optimizer_state"] > plan["params"] and plan["model_flops"] > 0
  if target.startswith("v5e"):
    assert plan["estimated_seconds"] > 0 and lines[6].startswith("estimate ")
  assert sorted(os.listdir(tmp_path)) == ["plan.json"]  # no run directory, no checkpoint


@pytest.mark.parametrize("target, overrides, message", [
    ("h100x8", ["train.mesh_data=3"], "train.mesh_data: data x fsdp x context x tensor = 3 x 1 x 1 x 1 needs 3 "
                                      "devices, found 8"),
    ("h100x8", ["data.batch_size=4"], "data.batch_size: 4 is not divisible by the data axes (data x fsdp = 8)"),
    ("h100", ["model.attention_impl=pallas_tpu"], "model.attention_impl: impl='pallas_tpu' runs on tpu"),
    ("v5e", ["model.attention_impl=mosaic_gpu", "model.head_dim=64", "model.dtype=bfloat16"],
     "model.attention_impl: impl='mosaic_gpu' runs on gpu"),
])
def test_what_the_target_cannot_hold_is_one_line(tmp_path, target, overrides, message):
  result = compile_for(tmp_path, target, *overrides)
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert result.returncode == 2 and len(errors) == 1 and message in errors[0], result.stderr[-2000:]
  assert os.listdir(tmp_path) == []

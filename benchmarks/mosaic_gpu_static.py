"""The static measure of the Mosaic GPU kernels (issue #66): version 1 (``impl="mosaic_gpu_v1"``),
version 2 (``impl="mosaic_gpu"``), its one-kernel backward (``impl="mosaic_gpu_fused"``: five units
a tile, both warpgroups' roles in its loop), its hardware-only path (``impl="mosaic_gpu_hw"``: that,
with register operands without SMEM tiles, ACC.init, approx_math) and JAX's own Hopper attention
(``attention_mgpu``: no gate, non-causal, the floor), compiled for an H100 (sm_90a) on a CPU machine,
read from ptxas and the SASS (lpcjax.aot.compiler_reports). Compiler counts, not speeds: what a GPU will time is
benchmarks/gpu_check.sh's.

For each kernel: registers, spill bytes, shared memory; for its per-tile loop (the innermost
loop holding the tensor-core instructions; a kernel whose masks are a branch has several paths
through it, so each path is its own build):

* units: the warpgroup's matmul work per trip in 64 x 64 x 128 units (from the HGMMA shapes);
* instructions: the tile loop's, the loop with the most units (each kernel here has one; should
  ptxas make two, the larger is given and the other beside it, ``lighter_copy_instructions``;
  the "heavier copies" of runs before 2026-12-06's fifth part were the ranges of mbarrier waits'
  retries, placed after the kernel's exit, which compiler_reports.sass_mix now leaves out);
* per element: the tile loop's instructions of each class (exp = MUFU, fp32, integer and other,
  loads and stores, synchronisation, control) per score element of the tile (the tile's
  elements over the warpgroup's 128 threads: 32 for a 64 x 64 tile, 64 for the forward's 64 x 128
  with wide key tiles).

Beside each kernel, the issue's cost model (``model``): per 64 x 64 of scores, its issue clocks
(one SASS instruction of a warpgroup's loop is four warp instructions: one clock of the SM's four
schedulers), its tensor clocks (a unit is 256: 2048 bf16 FMA a clock per SM) and the larger of
the two, the tile's time in the model; and per path and case (``model_steps``) a forward's and a
training step's clocks (the forward under a gradient and the backward's kernels), against
version 1's. The model sees no latency, no stall, no wait between warpgroups and no memory
traffic: an estimate from counts, not a time.

Version 2's paths (and its hardware path's): "edge" is every tile as version 1 builds it (the
masks), "interior" the build where every tile takes the unmasked arm (``_logits2`` replaced by
its unmasked half), which is what an interior tile runs, less its corner test (four
shared-memory loads and a few compares per tile, not per element). Cases: bf16, T = 4096, 4 heads, D = 64 and 128, plain
(causal) and with every feature (grouped K/V, window 512, segments, pruning).

  JAX_PLATFORMS=cpu python benchmarks/mosaic_gpu_static.py   # Python >= 3.12, pip install -e ".[aot]"

Prints a table and writes results/mosaic_gpu_static.json.
"""

import argparse
import datetime
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compile_check import run_attention, run_attention_mgpu  # noqa: E402  (the compile check's own runners)

from lpcjax.files import write_json_atomic  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
CLASSES = ("mufu", "fp32", "integer_other", "convert", "load_store", "sync", "control")
FEATURES = dict(kv_heads=2, window=512, segments=True, prune=True)
THREADS = 128  # one warpgroup: the SASS counts are per thread
TENSOR_CLOCKS_PER_UNIT = 256  # a 64 x 64 x 128 matmul at the issue's 2048 bf16 FMA a clock per SM
TILE = 64 * 64  # the model's figures are per 64 x 64 of scores
# a training step's kernels: the forward under a gradient (two_part where a version has one), then
# the backward's; a forward alone is "fwd"
BACKWARD = ("row_term", "dq", "dkv", "dkv_dq")


def tile_elements(kernel, units, head_dim):
  """Score elements of one trip of the kernel's tile loop, per warpgroup: a forward's from its
  units (64 x 64 x 128 each: per score element 2 D / 128 of them, 3 D / 128 in the two-part
  forward), as its key tile is 64 or 128 wide (attention_mgpu's 128); a backward's 64 x 64."""
  if "fwd" in kernel:
    return round(64 * 64 * 128 * units / ((3 if "two_part" in kernel else 2) * head_dim))
  return 64 * 64


def kernel_names(row):
  """The kernels' names: lpcjax's own, and for attention_mgpu (whose compiled kernels are named
  "entry" and "anonymous") its forward (the entry) and backward kernels by their matmul units
  (dQ has three products per tile, dK/dV four)."""
  kernels = row["kernels"]
  if not row["case"].startswith("attention_mgpu"):
    return [kernel["name"] for kernel in kernels]
  units = lambda kernel: max((mix.get("units", 0) for mix in kernel.get("loops") or []), default=0)
  backward = sorted((kernel for kernel in kernels if kernel["name"] != "entry"), key=units)
  label = {id(kernel): f"attention_mgpu {name}" for kernel, name in zip(backward, ("dq", "dkv"))}
  return [label.get(id(kernel), "attention_mgpu fwd") for kernel in kernels]


def measured(row, path, head_dim, setting):
  """A list of {case, path, kernel, registers, spills, smem, units, per element by class, model}
  of one compile row."""
  out = []
  if not row.get("compiled"):
    return [{"case": row["case"], "path": path, "error": row.get("error")}]
  seen = set()
  for kernel, name in zip(row["kernels"], kernel_names(row)):
    if name in seen:  # a forward built twice (alone and under the gradient) when they are one kernel
      continue
    seen.add(name)
    loops = kernel.get("loops") or []
    entry = {"case": row["case"], "path": path, "head_dim": head_dim, "setting": setting, "kernel": name,
             "registers": kernel.get("registers"),
             "spill_store_bytes": kernel.get("spill_store_bytes"), "spill_load_bytes": kernel.get("spill_load_bytes"),
             "smem_kib": round((kernel.get("smem_bytes") or 0) / 1024, 1)}
    # the tile loop: the one with the whole tile's matmuls (were there two, both are kept)
    units = max((mix.get("units", 0) for mix in loops), default=0)
    whole = sorted((mix for mix in loops if mix.get("units", 0) == units), key=lambda mix: mix["total"])
    if whole:
      per_thread = tile_elements(name, units, head_dim) / THREADS
      loop = whole[-1]
      entry.update(units=units, instructions=loop["total"], tensor=loop.get("tensor", 0),
                   per_element={name: round(loop.get(name, 0) / per_thread, 2) for name in CLASSES},
                   non_tensor_per_element=round((loop["total"] - loop.get("tensor", 0)) / per_thread, 2),
                   lighter_copy_instructions=whole[0]["total"] if len(whole) > 1 else None)
      entry["model"] = model(entry, head_dim)
    out.append(entry)
  return out


def role(kernel):
  """A kernel's part in a step, from its name: "fwd", "fwd_two_part", or a backward's ("row_term",
  "dq", "dkv", "dkv_dq"); the hardware path's "_hw" and the names' prefixes left off."""
  name = kernel.replace("attention_mgpu ", "").replace("forgetting_attention_mgpu_", "")
  return name[:-len("_hw")] if name.endswith("_hw") else name


def model(entry, head_dim):
  """The issue's cost model for one kernel's tile loop, per 64 x 64 of scores: issue and tensor
  clocks, and the larger, the tile's time in the model (it overlaps the two perfectly)."""
  per_tile = tile_elements(entry["kernel"], entry["units"], head_dim) / TILE
  issue, tensor = entry["instructions"] / per_tile, entry["units"] * TENSOR_CLOCKS_PER_UNIT / per_tile
  return {"issue_clocks": round(issue, 1), "tensor_clocks": round(tensor, 1), "clocks": round(max(issue, tensor), 1),
          "bound": "tensor" if tensor >= issue else "issue"}


def model_steps(entries):
  """Per (head dim, setting, path): the model's clocks per 64 x 64 of scores of a forward alone and
  of a training step (the forward a gradient runs, two-part where there is one, plus the backward's
  kernels), and each against version 1's in the same setting (attention_mgpu against version 1's
  plain case: it has no gate and no causal mask, and its delta, an XLA pass, is not counted)."""
  groups = {}
  for entry in entries:
    if "model" in entry:
      key = (entry["head_dim"], entry["setting"], entry["path"])
      groups.setdefault(key, {})[role(entry["kernel"])] = entry["model"]["clocks"]
  steps = []
  for (head_dim, setting, path), clocks in groups.items():
    training = [clocks.get("fwd_two_part", clocks.get("fwd"))] + [clocks[name] for name in BACKWARD if name in clocks]
    steps.append({"head_dim": head_dim, "setting": setting, "path": path, "forward_clocks": clocks.get("fwd"),
                  "training_step_clocks": None if None in training else round(sum(training), 1)})
  for step in steps:
    version_1 = [other for other in steps if other["path"] == "v1" and other["head_dim"] == step["head_dim"]
                 and other["setting"] == ("plain" if step["path"] == "floor" else step["setting"])]
    for name in ("forward", "training_step"):  # where both compiled (a failed kernel has no count)
      if version_1 and step[f"{name}_clocks"] and version_1[0][f"{name}_clocks"]:
        step[f"{name}_vs_v1"] = round(step[f"{name}_clocks"] / version_1[0][f"{name}_clocks"], 3)
  return steps


def interior_build():
  """Every tile of version 2 takes the unmasked arm: the instructions an interior tile runs."""
  from lpcjax.kernels import mosaic_gpu
  original = mosaic_gpu._logits2
  mosaic_gpu._logits2 = lambda scores, queries, keys, scale2, window, masks_only_where_needed=False, columns=None: (
      mosaic_gpu._unmasked_logits2(scores, queries, keys, scale2, columns) if masks_only_where_needed
      else original(scores, queries, keys, scale2, window, columns=columns))
  return lambda: setattr(mosaic_gpu, "_logits2", original)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=os.path.join(RESULTS, "mosaic_gpu_static.json"))
  parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
  args = parser.parse_args()
  entries = []
  for head_dim in args.head_dims:
    for setting, extra in (("plain", {}), ("every feature", FEATURES)):
      fields = dict(dtype="bfloat16", head_dim=head_dim, seq_len=4096, heads=4, **extra)
      entries += measured(run_attention("h100", dict(impl="mosaic_gpu_v1", **fields)), "v1", head_dim, setting)
      for impl, path in (("mosaic_gpu", "v2"), ("mosaic_gpu_fused", "v2 fused"), ("mosaic_gpu_hw", "v2 hw")):
        entries += measured(run_attention("h100", dict(impl=impl, **fields)), f"{path} edge", head_dim, setting)
        restore = interior_build()
        try:
          entries += measured(run_attention("h100", dict(impl=impl, **fields)), f"{path} interior", head_dim,
                              setting)
        finally:
          restore()
    entries += measured(run_attention_mgpu("h100", dict(impl="attention_mgpu", dtype="float16", head_dim=head_dim,
                                                        seq_len=4096, heads=4)), "floor", head_dim, "no gate")
  print(f"{'case':62} {'path':16} {'kernel':38} {'regs':>4} {'spill':>9} {'smem':>6} {'units':>5} "
        f"{'non-tensor/elem':>15} " + " ".join(f"{name[:6]:>6}" for name in CLASSES))
  for entry in entries:
    if "error" in entry:
      print(f"{entry['case']:62} {entry['path']:16} FAILED: {entry['error']}")
      continue
    per = entry.get("per_element", {})
    print(f"{entry['case']:62} {entry['path']:16} {entry['kernel'][:38]:38} {entry['registers'] or '':>4} "
          f"{entry['spill_store_bytes']}/{entry['spill_load_bytes']:<4} {entry['smem_kib']:>6} "
          f"{entry.get('units', ''):>5} {entry.get('non_tensor_per_element', ''):>15} "
          + " ".join(f"{per.get(name, ''):>6}" for name in CLASSES))
  steps = model_steps(entries)
  print(f"\nthe cost model, clocks per 64 x 64 of scores (an estimate from counts, not a time)\n"
        f"{'D':>4} {'setting':14} {'path':18} {'forward':>8} {'vs v1':>6} {'training step':>14} {'vs v1':>6}")
  for step in steps:
    print(f"{step['head_dim']:>4} {step['setting']:14} {step['path']:18} {step['forward_clocks'] or '':>8} "
          f"{step.get('forward_vs_v1', ''):>6} {step['training_step_clocks']:>14} "
          f"{step.get('training_step_vs_v1', ''):>6}")
  import jax
  write_json_atomic(args.out, {"date": datetime.date.today().isoformat(), "machine": platform.node(),
                               "jax": jax.__version__, "python": platform.python_version(),
                               "note": "compiler counts for sm_90a (ptxas, nvdisasm), not speeds; model: the issue's "
                                       "cost model from those counts, per 64 x 64 of scores, an estimate",
                               "rows": entries, "model_steps": steps})
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()

"""Every accelerator kernel compiled ahead of time for its chips on this CPU machine: the resource table.

The full grid of what CI compiles in small (tests/kernels/test_compile_for_chips.py): the GPU
backends (pallas, triton, mosaic_gpu, its one-kernel backward mosaic_gpu_fused and its hardware path
mosaic_gpu_hw) for an H100 (sm_90a) and
the TPU backend for v5e, v6e and v5p, forward and backward, over head dims 64 and 128, bf16 and
fp16 (float32 where the backend takes it), plain and with grouped K/V + a window + segments +
pruning, T from 2k to 16k, the context-parallel ring's pair kernels over two H100s; JAX's own
Hopper attention (attention_mgpu) as the floor without the gate; and a FoX training step per
backend. Each case compiles in a fresh process (a compiler's crash or state cannot reach the next
case; XLA's Triton dump, the only source of a Pallas kernel's shared memory, slows every later
compile of its process). For each kernel: registers, spill bytes, shared memory or VMEM, barriers,
threads, and the instruction mix of its tensor-core loops (lpcjax.aot.compiler_reports). These are
the compilers' counts, not speeds; gpu_check.sh adds a runtime column on a GPU
(benchmarks/gpu_report.py). The peers' Triton kernels (the official FoX kernel, fla) are compiled
by compile_peers.py.

  pip install -e ".[aot,triton]"        # Python >= 3.12: the compilers, no GPU or TPU needed
  pip install nvidia-cuda-runtime-cu12  # only for attention_mgpu: its forward asks the runtime's version
  JAX_PLATFORMS=cpu python benchmarks/compile_check.py [--quick] [--only gpu|tpu|steps|peers]
  python benchmarks/compile_check.py --markdown   # the docs' tables from the result files

--only (a part) and --cases (names holding a text) run cases again and replace their rows in the
result files, keeping the others.

Writes results/compile_sm90.json and results/compile_tpu.json (and prints a table per target);
a case that fails to compile is a row with the compiler's message, and the exit status is 1.
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
FEATURES = dict(heads=4, kv_heads=2, window=512, segments=True, prune=True)


def attention_grid(quick):
  """(target, AttentionCase fields) of every attention compile."""
  rows = []
  gpu_dtypes = {"pallas": ("bfloat16", "float16", "float32"), "triton": ("bfloat16", "float16", "float32"),
                "mosaic_gpu": ("bfloat16", "float16"), "mosaic_gpu_fused": ("bfloat16", "float16"),
                "mosaic_gpu_hw": ("bfloat16", "float16")}
  for impl, dtypes in gpu_dtypes.items():
    for head_dim in (64, 128):
      rows.append(("h100", dict(impl=impl, dtype="bfloat16", head_dim=head_dim, seq_len=16384, heads=4)))
      rows.append(("h100", dict(impl=impl, dtype="bfloat16", head_dim=head_dim, seq_len=2048, **FEATURES)))
      if not impl.startswith("mosaic_gpu"):  # the context-parallel ring's pair kernels, over two GPUs
        rows.append(("h100x2", dict(impl=impl, dtype="bfloat16", head_dim=head_dim, seq_len=8192, context=2,
                                    **FEATURES)))
      if not quick:
        for dtype in dtypes[1:]:
          rows.append(("h100", dict(impl=impl, dtype=dtype, head_dim=head_dim, seq_len=4096, **FEATURES)))
  for chip in (("v5e", "v6e") if quick else ("v5e", "v6e", "v5p")):
    for head_dim in (64, 128):
      for dtype in ("bfloat16", "float32"):
        rows.append((chip, dict(impl="pallas_tpu", dtype=dtype, head_dim=head_dim, seq_len=16384, heads=4)))
        rows.append((chip, dict(impl="pallas_tpu", dtype=dtype, head_dim=head_dim, seq_len=2048, **FEATURES)))
  return rows


# FoX 125M as the paper trains it (12 layers, d 768, 12 heads x 64, bf16), 8 sequences of 4,096
# tokens a device, with each backend: the step XLA compiles around the kernels.
STEP_OVERRIDES = ["model.dtype=bfloat16", "data.seq_len=4096", "data.batch_size=8"]
STEP_CASES = [("h100", "pallas"), ("h100", "triton"), ("h100", "mosaic_gpu"), ("h100", "xla"),
              ("v5e", "pallas_tpu"), ("v5e", "xla")]


def run_attention(target, fields):
  """One attention case's row; ``over_limit`` names the kernels whose shared memory (GPU) or VMEM
  (TPU, the default scoped limit) the chip could not give them: such a kernel compiles (jax-triton's
  shared memory is only asked for at launch) but would not run."""
  from lpcjax.aot import compile_only_devices, parse_target
  from lpcjax.aot.attention_check import AttentionCase, compile_attention
  row = compile_attention(AttentionCase(**fields), compile_only_devices(target), xla_triton_smem=True)
  spec = parse_target(target).spec
  limit = getattr(spec, "smem_per_block_optin", None) or getattr(spec, "scoped_vmem_bytes", None)
  used = lambda kernel: kernel.get("smem_bytes") or kernel.get("vmem_bytes") or 0
  row["over_limit"] = [kernel["name"] for kernel in row.get("kernels", []) if used(kernel) > limit]
  return row


def run_attention_mgpu(target, fields):
  """JAX's own Hopper flash attention (``attention_mgpu``), forward and backward, as the floor
  without the gate: non-causal, as JAX refuses its causal mask on every CUDA 12.8/12.9 runtime
  (a ptxas miscompile) and its backward has no causal mode."""
  import time
  import jax
  import jax.numpy as jnp
  from jax.experimental.pallas.ops.gpu import attention_mgpu
  from jax.sharding import SingleDeviceSharding
  from lpcjax.aot import compile_only_devices
  from lpcjax.aot.attention_check import first_line
  from lpcjax.aot.compiler_reports import GpuDumps
  from lpcjax.aot.targets import COMPILER_OPTIONS, no_compilation_cache
  device = compile_only_devices(target)[0]
  config = attention_mgpu.TuningConfig(block_q=64, block_kv=128, max_concurrent_steps=2, block_q_dkv=64,
                                       block_kv_dkv=64, block_q_dq=64, block_kv_dq=64)
  shape = (1, fields["seq_len"], fields["heads"], fields["head_dim"])
  qkv = jax.ShapeDtypeStruct(shape, jnp.dtype(fields["dtype"]), sharding=SingleDeviceSharding(device))
  loss = lambda q, k, v: jnp.sum(attention_mgpu.attention(q, k, v, config).astype(jnp.float32))
  row = {**fields, "case": "attention_mgpu-{dtype}-D{head_dim}-T{seq_len}-H{heads}-noncausal".format(**fields),
         "target": device.device_kind, "config": str(config)}
  start = time.perf_counter()
  try:
    with GpuDumps() as dumps, jax.default_device(device), no_compilation_cache():
      compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).trace(qkv, qkv, qkv).lower().compile(
          {**COMPILER_OPTIONS, **dumps.compiler_options})
      kernels = dumps.reports(compiled.as_text())
  except Exception as error:  # the compiler's message is the result
    return {**row, "compiled": False, "error": first_line(error), "seconds": round(time.perf_counter() - start, 1)}
  return {**row, "compiled": True, "seconds": round(time.perf_counter() - start, 1),
          "kernels": [kernel.as_dict() for kernel in kernels]}


def run_step(target, impl):
  import time
  from lpcjax import experiment
  from lpcjax.aot import compile_only_devices
  from lpcjax.aot.attention_check import first_line
  from lpcjax.aot.train_step import compile_train_step
  config = experiment.apply_overrides(experiment.load_experiment("paper:fox_125m"),
                                      STEP_OVERRIDES + [f"model.attention_impl={impl}"])
  row = {"kind": "train_step", "target": target, "impl": impl, "config": "paper:fox_125m",
         "overrides": STEP_OVERRIDES}
  start = time.perf_counter()
  try:
    compiled = compile_train_step(config, compile_only_devices(target))
  except Exception as error:  # the compiler's message is the result
    return {**row, "compiled": False, "error": first_line(error), "seconds": round(time.perf_counter() - start, 1)}
  memory = compiled.memory_analysis()
  fields = ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes", "generated_code_size_in_bytes")
  return {**row, "compiled": True, "seconds": round(time.perf_counter() - start, 1),
          "memory": {name: getattr(memory, name) for name in fields}}


def in_fresh_process(kind, target, payload):
  """One case in a new Python process; its row (or the crash as an error row)."""
  command = [sys.executable, __file__, "--one", json.dumps({"kind": kind, "target": target, "payload": payload})]
  done = subprocess.run(command, capture_output=True, text=True, check=False)
  lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
  if done.returncode or not lines:
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return {"kind": kind, "target": target, **(payload if isinstance(payload, dict) else {"impl": payload}),
            "compiled": False, "error": f"the compile process failed: {tail[:300]}"}
  return json.loads(lines[-1])


def versions():
  import jax
  from importlib.metadata import PackageNotFoundError, version
  from lpcjax.aot.compiler_reports import Toolchain
  found = {"jax": jax.__version__, "ptxas": Toolchain.find().version()}
  for package in ("jaxlib", "jax-cuda12-plugin", "libtpu", "jax-triton", "triton"):
    try:
      found[package] = version(package)
    except PackageNotFoundError:
      found[package] = None
  return found


def table(rows):
  """A line per kernel: case, kernel, registers, spills, SMEM or VMEM, lightest tensor loop."""
  lines = [f"{'case':58} {'kernel':34} {'regs':>4} {'spill st/ld':>11} {'smem/vmem KiB':>13} {'loop':>18}"]
  for row in rows:
    name = row.get("case") or f"train step {row['impl']}"
    if not row["compiled"]:
      lines.append(f"{name:58} FAILED: {row['error'][:120]}")
      continue
    if row.get("kind") == "train_step":
      memory = row["memory"]
      total = (memory["argument_size_in_bytes"] + memory["temp_size_in_bytes"]) / 2**30
      lines.append(f"{name:58} {'(whole step)':34} arguments + temporaries {total:.2f} GiB per device")
      continue
    for kernel in row["kernels"]:
      memory = kernel.get("smem_bytes", kernel.get("vmem_bytes"))
      loops = kernel.get("loops") or []
      lightest = min(loops, key=lambda mix: mix["total"]) if loops else None
      spills = "" if "registers" not in kernel else "{spill_store_bytes}/{spill_load_bytes}".format(**kernel)
      memory = "" if memory is None else f"{memory / 1024:.0f}"
      loop = "" if lightest is None else "{} ({} mma)".format(lightest["total"], lightest.get("tensor", 0))
      registers = kernel.get("registers", "")
      lines.append(f"{name:58} {kernel['name']:34} {registers:>4} {spills:>11} {memory:>13} {loop:>18}")
  return "\n".join(lines)


def markdown(paths, head_dim=128, dtype="bfloat16"):
  """The docs' table (docs/compile_check.md) from the result files, a row per kernel of each
  ``dtype`` case at ``head_dim`` (the JSON holds every case): registers, spills, shared memory or
  VMEM, threads, and the instruction mix of the kernel's lightest tensor-core loop."""
  lines = ["| case | kernel | regs | spill B st/ld | SMEM or VMEM KiB | threads "
           "| loop: instr / mma / exp / fp32 / ld-st / sync |", "|---|---|---|---|---|---|---|"]
  for path in paths:
    if not os.path.exists(path):
      continue
    with open(path) as f:
      rows = json.load(f)["rows"]
    for row in rows:
      if (row.get("kind") == "train_step" or not row.get("compiled") or row.get("head_dim") != head_dim
              or row.get("dtype") != dtype):
        continue
      for kernel in row["kernels"]:
        memory = kernel.get("smem_bytes", kernel.get("vmem_bytes"))
        loops = kernel.get("loops") or []
        mix = min(loops, key=lambda m: m["total"]) if loops else None
        mix = "–" if mix is None else " / ".join(str(mix.get(k, 0)) for k in (
            "total", "tensor", "mufu", "fp32", "load_store", "sync"))
        spills = "–" if "registers" not in kernel else "{spill_store_bytes}/{spill_load_bytes}".format(**kernel)
        target = "" if row["target"].startswith("NVIDIA") else f" ({row['target']})"
        lines.append(f"| {row['case']}{target} | {kernel['name']} | {kernel.get('registers', '–')} | {spills} | "
                     f"{'–' if memory is None else f'{memory / 1024:.0f}'} | {kernel.get('threads', '–')} | {mix} |")
  return "\n".join(lines)


def step_markdown(paths):
  """The training steps' rows: target, backend, compiled or not, XLA's memory analysis per device."""
  lines = ["| target | backend | arguments GiB | temporaries GiB | outputs GiB | code MiB | compile s |",
           "|---|---|---|---|---|---|---|"]
  for path in paths:
    if not os.path.exists(path):
      continue
    with open(path) as f:
      for row in json.load(f)["rows"]:
        if row.get("kind") != "train_step":
          continue
        if not row["compiled"]:
          lines.append(f"| {row['target']} | {row['impl']} | failed: {row['error'][:100]} | | | | |")
          continue
        m = row["memory"]
        lines.append(f"| {row['target']} | {row['impl']} | {m['argument_size_in_bytes'] / 2**30:.2f} | "
                     f"{m['temp_size_in_bytes'] / 2**30:.2f} | {m['output_size_in_bytes'] / 2**30:.2f} | "
                     f"{m['generated_code_size_in_bytes'] / 2**20:.1f} | {row['seconds']} |")
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="bf16 and two TPUs only (about a third of the grid)")
  parser.add_argument("--only", choices=("gpu", "tpu", "steps", "peers"), help="one part of the grid")
  parser.add_argument("--cases", help="only the cases whose name holds this text (e.g. triton-float32)")
  parser.add_argument("--markdown", action="store_true", help="print the docs' table from the result files")
  parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: one case, in this process
  args = parser.parse_args()
  if args.markdown:
    paths = [os.path.join(RESULTS, name) for name in ("compile_sm90.json", "compile_tpu.json")]
    print(markdown(paths) + "\n\n" + step_markdown(paths))
    return
  if args.one:
    case = json.loads(args.one)
    run = {"train_step": run_step, "attention": run_attention, "attention_mgpu": run_attention_mgpu}[case["kind"]]
    row = run(case["target"], case["payload"])
    print(json.dumps({"kind": case["kind"], **row}, default=str))
    return

  from lpcjax.aot import parse_target
  from lpcjax.files import write_json_atomic
  cases = [("attention", target, fields) for target, fields in attention_grid(args.quick)]
  cases += [("attention_mgpu", "h100", dict(impl="attention_mgpu", dtype="float16", head_dim=head_dim, seq_len=16384,
                                            heads=4)) for head_dim in (64, 128)]
  cases += [("train_step", target, impl) for target, impl in STEP_CASES]
  rows = []
  for kind, target, payload in cases:
    if not selected(args.only, kind, parse_target(target).kind):
      continue
    if args.cases and args.cases not in case_name(kind, target, payload):
      continue
    row = in_fresh_process(kind, target, payload)
    row["platform"] = parse_target(target).kind
    rows.append(row)
    print(table([row]).split("\n", 1)[1], flush=True)
  machine = f"{platform.machine()}, {os.cpu_count()} CPUs, no accelerator"
  header = {"machine": machine, "versions": versions(),
            "command": "JAX_PLATFORMS=cpu python benchmarks/compile_check.py" + (" --quick" if args.quick else "")}
  for platform_kind, name in (("gpu", "compile_sm90.json"), ("tpu", "compile_tpu.json")):
    part = [row for row in rows if row["platform"] == platform_kind]
    if not part:
      continue
    path = os.path.join(RESULTS, name)
    kept = []  # a part run again (--only, --cases) replaces its own rows and keeps the others
    if (args.only or args.cases) and os.path.exists(path):
      ran = {row_key(row) for row in part}
      with open(path) as f:
        kept = [row for row in json.load(f)["rows"] if row_key(row) not in ran]
    for row in part:
      row["date"] = datetime.date.today().isoformat()
    write_json_atomic(path, {**header, "rows": kept + part})
    print(f"wrote {path}")
  sys.exit(0 if all(row["compiled"] and not row.get("over_limit") for row in rows) else 1)


def case_name(kind, target, payload):
  """The name a case's row carries ("case"), known before it runs."""
  if kind == "attention":
    from lpcjax.aot.attention_check import AttentionCase
    return AttentionCase(**payload).name
  return f"{kind}-{target}-{payload if isinstance(payload, str) else payload['impl']}"


def row_key(row):
  return (row["kind"], row["target"], row.get("case") or row.get("impl"))


def selected(only, kind, platform_kind):
  """Whether a case of ``kind`` for a ``platform_kind`` target belongs to the part ``--only`` names."""
  if only is None:
    return True
  attention = kind == "attention"
  return {"steps": kind == "train_step", "peers": kind == "attention_mgpu",
          "gpu": attention and platform_kind == "gpu", "tpu": attention and platform_kind == "tpu"}[only]


if __name__ == "__main__":
  main()

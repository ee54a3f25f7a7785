"""Compile the Pallas kernels to NVIDIA machine code on a machine without a GPU; report resources.

The backend tests run the kernels interpreted; tests/kernels/test_pallas_lowering.py lowers them
to Triton IR. This goes the rest of the way that needs no GPU: Triton IR -> PTX (XLA's own Triton
pipeline, from the CUDA plugin) -> SASS (ptxas), for one GPU generation, and prints each
kernel's shared memory, registers, spills and whether it uses Hopper's wgmma. A kernel whose
shared memory exceeds the per-block limit, or that spills heavily, shows up here before any GPU
time is spent. It measures no speed.

  pip install --no-deps --target /tmp/jax-cuda jax-cuda12-plugin==$V jax-cuda12-pjrt==$V \
      nvidia-cuda-nvcc-cu12          # $V = your jaxlib version; nvcc only for ptxas
  python benchmarks/triton_compile.py --plugin-path /tmp/jax-cuda [--arch 9.0]

Uses two JAX internals (the Triton compilation-handler registry and the serialized Triton
module in the lowered custom call) that exist in jaxlib 0.10.x; JAX 0.11 dropped the first (XLA
compiles the kernels when the program is compiled, which needs a GPU).
"""

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

# the row-term kernel runs for bf16/fp16 inputs only (the --dtypes here), see kernels/row_term.py
KERNELS = ("forgetting_attention_fwd", "forgetting_attention_dkv", "forgetting_attention_dq",
           "forgetting_attention_row_term")
# Shared memory one block may use (opt-in maximum), per compute capability; others: not judged.
SMEM_LIMIT = {"8.0": 163 * 1024, "8.6": 99 * 1024, "8.9": 99 * 1024, "9.0": 227 * 1024}


def parse_args():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--plugin-path", help="folder holding jax_plugins/xla_cuda12 (pip --target)")
  parser.add_argument("--arch", default="9.0", help="compute capability to compile for")
  parser.add_argument("--seq-len", type=int, default=4096)
  parser.add_argument("--head-dims", type=int, nargs="+", default=[16, 32, 64, 128])
  parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"])
  parser.add_argument("--ptxas", help="ptxas binary (default: nvidia-cuda-nvcc-cu12's, or PATH)")
  parser.add_argument("--out", help="default: results/triton_compile_sm<arch>.json")
  args = parser.parse_args()
  if args.out is None:
    args.out = os.path.join(os.path.dirname(__file__), "results",
                            f"triton_compile_sm{args.arch.replace('.', '')}.json")
  return args


def find_ptxas(explicit):
  if explicit:
    return explicit
  for root in sys.path:
    found = glob.glob(os.path.join(root, "nvidia", "cuda_nvcc", "bin", "ptxas"))
    if found:
      return found[0]
  return shutil.which("ptxas")


def ptxas_report(ptxas, ptx, arch):
  """Registers and spill bytes from ``ptxas -v``, or {} without ptxas."""
  if ptxas is None:
    return {}
  sm = "sm_" + arch.replace(".", "") + ("a" if arch == "9.0" else "")
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "kernel.ptx")
    with open(path, "w") as f:
      f.write(ptx)
    run = subprocess.run([ptxas, f"-arch={sm}", "-v", path, "-o", os.path.join(tmp, "k.cubin")],
                         capture_output=True, text=True, check=False)
  if run.returncode:
    raise RuntimeError(f"ptxas failed: {run.stderr.strip().splitlines()[-1]}")
  number = lambda pattern: int(re.search(pattern, run.stderr).group(1))
  return {"registers": number(r"Used (\d+) registers"),
          "spill_store_bytes": number(r"(\d+) bytes spill stores"),
          "spill_load_bytes": number(r"(\d+) bytes spill loads")}


def triton_custom_calls(lowered):
  """(module bytes, num_warps, num_stages) of each Triton custom call not yet compiled."""
  def walk(op):
    for region in op.regions:
      for block in region.blocks:
        for inner in block.operations:
          yield inner.operation
          yield from walk(inner.operation)
  for op in walk(lowered.compiler_ir("stablehlo").operation):
    if op.name == "stablehlo.custom_call" and "triton" in str(op.attributes["call_target_name"]):
      config = op.attributes["mhlo.backend_config"]
      if "ir" in config:
        yield config["ir"].value_bytes, config["num_warps"].value, config["num_stages"].value


def main():
  args = parse_args()
  if args.plugin_path:
    sys.path.insert(0, args.plugin_path)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compile only: no CUDA client is created
  import jax
  import jax.numpy as jnp
  from jax._src.lib import triton as jaxlib_triton
  from lpcjax.files import write_json_atomic
  from lpcjax.kernels import forgetting_attention, pallas_gpu

  jax.devices()  # discovers the CUDA plugin, which registers the Triton compiler
  if not hasattr(jaxlib_triton, "has_compilation_handler"):
    sys.exit(f"error: jax {jax.__version__} compiles Pallas-Triton kernels only inside XLA at run "
             "time; this check needs jaxlib 0.10.x (run it with Python 3.11)")
  if not jaxlib_triton.has_compilation_handler("CUDA"):
    sys.exit("error: no Triton compiler for CUDA; install jax-cuda12-plugin and jax-cuda12-pjrt "
             f"=={jax.__version__} (see this script's docstring) and pass --plugin-path")
  compile_cuda = jaxlib_triton._compilation_handlers["CUDA"]
  compiled = []

  def recording_handler(module, arch_name, num_warps, num_ctas, num_stages):
    result = compile_cuda(module, args.arch, num_warps, num_ctas, num_stages)
    name = next((k for k in KERNELS if k.encode() in module), "unknown")
    compiled.append((name, num_warps, num_stages, result))
    return result

  jaxlib_triton._compilation_handlers["CUDA"] = recording_handler  # newer jaxlib compiles here
  pallas_gpu.on_gpu = lambda: True  # lowering only; nothing runs
  ptxas = find_ptxas(args.ptxas)
  rows = []
  print(f"jax {jax.__version__}, compute capability {args.arch}, ptxas: {ptxas or 'not found'}")
  print(f"{'kernel':>5} {'D':>4} {'dtype':>8} {'prune':>5} {'warps':>5} {'stages':>6} "
        f"{'smem KiB':>8} {'regs':>4} {'spill B':>7} {'wgmma':>5}")
  for head_dim in args.head_dims:
    for dtype in args.dtypes:
      for prune in (None, 1e-4):
        def loss(q, k, v, log_f, prune=prune):
          o = forgetting_attention(q, k, v, log_f, impl="pallas", prune_epsilon=prune)
          return jnp.sum(o.astype(jnp.float32))
        qkv = jax.ShapeDtypeStruct((1, args.seq_len, 2, head_dim), jnp.dtype(dtype))
        log_f = jax.ShapeDtypeStruct((1, args.seq_len, 2), jnp.float32)
        compiled.clear()
        lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).trace(qkv, qkv, qkv, log_f).lower(
            lowering_platforms=("cuda",))
        for module, warps, stages in triton_custom_calls(lowered):  # jaxlib <= 0.10.2
          jaxlib_triton.compile("cuda", module, args.arch, num_warps=warps, num_ctas=1,
                                num_stages=stages)
        expected = KERNELS if dtype != "float32" else KERNELS[:3]
        if sorted(name for name, *_ in compiled) != sorted(expected):
          sys.exit(f"error: expected the kernels {expected}, compiled {[c[0] for c in compiled]}: "
                   "this JAX lowers differently from the one this script was written for")
        for name, warps, stages, result in compiled:
          row = {"kernel": name, "head_dim": head_dim, "dtype": dtype, "prune": prune is not None,
                 "num_warps": warps, "num_stages": stages, "smem_bytes": result.smem_bytes,
                 "fits_smem": (result.smem_bytes <= SMEM_LIMIT[args.arch]
                               if args.arch in SMEM_LIMIT else None),
                 "wgmma": "wgmma.mma_async" in result.asm, **ptxas_report(ptxas, result.asm, args.arch)}
          rows.append(row)
          spill = row.get("spill_store_bytes", "-")
          print(f"{name.rsplit('_', 1)[1]:>5} {head_dim:>4} {dtype:>8} {row['prune']!s:>5} "
                f"{warps:>5} {stages:>6} {result.smem_bytes / 1024:>8.1f} "
                f"{row.get('registers', '-'):>4} {spill:>7} {row['wgmma']!s:>5}"
                + ("  EXCEEDS SHARED MEMORY" if row["fits_smem"] is False else ""))
  write_json_atomic(args.out, {"jax": jax.__version__, "arch": args.arch, "seq_len": args.seq_len,
                               "ptxas": bool(ptxas), "rows": rows})
  print(f"wrote {args.out}")
  if any(row["fits_smem"] is False for row in rows):
    sys.exit(1)


if __name__ == "__main__":
  main()

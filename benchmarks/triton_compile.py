"""Compile the Pallas kernels to NVIDIA machine code on a machine without a GPU; report resources.

The backend tests run the kernels interpreted; tests/kernels/test_pallas_lowering.py lowers them
to Triton IR. This goes the rest of the way that needs no GPU: Triton IR -> PTX (XLA's own Triton
pipeline, from the CUDA plugin) -> SASS (ptxas), for one GPU generation, and prints each
kernel's shared memory, registers, spills and whether it uses Hopper's wgmma. A kernel whose
shared memory exceeds the per-block limit, or that spills heavily, shows up here before any GPU
time is spent. It measures no speed. ``--pair true`` compiles the kernels as the
context-parallel ring launches them on a pair of --seq-len chunks (heads-major chunks, separate
row and column vectors, traced offsets, float32 outputs; kernels/gpu_calls.py).

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
import shutil
import sys

import compile_report  # benchmarks/ is the script's directory

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
  return compile_report.parse_args(parser, "triton_compile")


def find_ptxas(explicit):
  if explicit:
    return explicit
  for root in sys.path:
    found = glob.glob(os.path.join(root, "nvidia", "cuda_nvcc", "bin", "ptxas"))
    if found:
      return found[0]
  return shutil.which("ptxas")


def mlir_operations(op):
  """Every operation nested inside the MLIR operation ``op``, depth first."""
  for region in op.regions:
    for block in region.blocks:
      for inner in block.operations:
        yield inner.operation
        yield from mlir_operations(inner.operation)


def triton_custom_calls(lowered):
  """(module bytes, num_warps, num_stages) of each Triton custom call not yet compiled."""
  for op in mlir_operations(lowered.compiler_ir("stablehlo").operation):
    if op.name == "stablehlo.custom_call" and "triton" in str(op.attributes["call_target_name"]):
      config = op.attributes["mhlo.backend_config"]
      if "ir" in config:
        yield config["ir"].value_bytes, config["num_warps"].value, config["num_stages"].value


def single_device(jax, jnp, seq_len, head_dim, dtype, prune):
  """(function, argument specs): forward + backward of forgetting_attention on one device."""
  from lpcjax.kernels import forgetting_attention

  def loss(q, k, v, log_f):
    o = forgetting_attention(q, k, v, log_f, impl="pallas", prune_epsilon=prune)
    return jnp.sum(o.astype(jnp.float32))
  qkv = jax.ShapeDtypeStruct((1, seq_len, 2, head_dim), jnp.dtype(dtype))
  return jax.grad(loss, argnums=(0, 1, 2, 3)), (qkv, qkv, qkv, jax.ShapeDtypeStruct((1, seq_len, 2), jnp.float32))


def chunk_pair(jax, jnp, seq_len, head_dim, dtype, prune):
  """(function, argument specs): the pallas backend's pair kernels on one (query chunk, key
  chunk) pair as the ring calls them, offsets traced: forward, the row term (bf16/fp16), dQ and
  dK/dV/dc."""
  from lpcjax.kernels import backends, decay
  pairs = backends.get("pallas").pair_kernels
  sizes = pairs.block_sizes(None, seq_len, head_dim)

  def run(q, k, v, c, seg, do, offsets):
    thr = jnp.full(q.shape[:2], -20.0) if prune else None
    c = decay.TwoFloat(c, jnp.zeros_like(c))
    args = (q, k, v, c, c, seg, seg, thr, (offsets[0], offsets[1]))
    options = (head_dim ** -0.5, sizes, None, False)
    o, lse = pairs.forward(*args, *options)
    if dtype == "float32":
      delta = jnp.sum(o * do.astype(jnp.float32), axis=-1)
    else:
      delta = pairs.row_term(*args, do, lse, *options)
    return (o, pairs.backward_dq(*args, do, lse, delta, *options),
            pairs.backward_dkv(*args, do, lse, delta, *options))
  qkv = jax.ShapeDtypeStruct((1, 2, seq_len, head_dim), jnp.dtype(dtype))
  vector = lambda dtype: jax.ShapeDtypeStruct((1, 2, seq_len), dtype)
  return run, (qkv, qkv, qkv, vector(jnp.float32), vector(jnp.int32), qkv,
               jax.ShapeDtypeStruct((2,), jnp.int32))


def main():
  args = parse_args()
  if args.plugin_path:
    sys.path.insert(0, args.plugin_path)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compile only: no CUDA client is created
  import jax
  import jax.numpy as jnp
  from jax._src.lib import triton as jaxlib_triton
  from lpcjax.kernels import pallas_gpu

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
  print(f"{'kernel':>5} {'pair':>5} {'D':>4} {'dtype':>8} {'prune':>5} {'warps':>5} {'stages':>6} "
        f"{'smem KiB':>8} {'regs':>4} {'spill B':>7} {'wgmma':>5}")
  for pair in args.pair:
    for head_dim in args.head_dims:
      for dtype in args.dtypes:
        for prune in (None, 1e-4):
          fn, specs = (chunk_pair if pair else single_device)(jax, jnp, args.seq_len, head_dim, dtype, prune)
          compiled.clear()
          lowered = jax.jit(fn).trace(*specs).lower(lowering_platforms=("cuda",))
          for module, warps, stages in triton_custom_calls(lowered):  # jaxlib <= 0.10.2
            jaxlib_triton.compile("cuda", module, args.arch, num_warps=warps, num_ctas=1,
                                  num_stages=stages)
          expected = KERNELS if dtype != "float32" else KERNELS[:3]
          if sorted(name for name, *_ in compiled) != sorted(expected):
            sys.exit(f"error: expected the kernels {expected}, compiled {[c[0] for c in compiled]}: "
                     "this JAX lowers differently from the one this script was written for")
          for name, warps, stages, result in compiled:
            row = {"kernel": name, "pair": pair, "head_dim": head_dim, "dtype": dtype, "prune": prune is not None,
                   "num_warps": warps, "num_stages": stages, "smem_bytes": result.smem_bytes,
                   "fits_smem": (result.smem_bytes <= SMEM_LIMIT[args.arch]
                                 if args.arch in SMEM_LIMIT else None),
                   "wgmma": "wgmma.mma_async" in result.asm,
                   **compile_report.ptxas_report(ptxas, result.asm, args.arch)}
            rows.append(row)
            spill = row.get("spill_store_bytes", "-")
            print(f"{name.rsplit('_', 1)[1]:>5} {pair!s:>5} {head_dim:>4} {dtype:>8} {row['prune']!s:>5} "
                  f"{warps:>5} {stages:>6} {result.smem_bytes / 1024:>8.1f} "
                  f"{row.get('registers', '-'):>4} {spill:>7} {row['wgmma']!s:>5}"
                  + ("  EXCEEDS SHARED MEMORY" if row["fits_smem"] is False else ""))
  compile_report.write_report(args.out, {"jax": jax.__version__, "arch": args.arch, "seq_len": args.seq_len,
                                         "ptxas": bool(ptxas)}, rows)


if __name__ == "__main__":
  main()

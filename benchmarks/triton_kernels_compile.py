"""Compile impl="triton"'s kernels to sm_90a machine code without a GPU; report their resources.

benchmarks/triton_compile.py does this for the Pallas kernels through XLA's Triton pipeline; the
kernels of kernels/triton_kernels.py are plain Triton, so Triton's own compiler does it here
(Triton IR -> PTX -> cubin, with the ptxas that ships in the triton wheel), with exactly the
constexprs, tiles, warps and stages that the backend launches them with (triton_backend.py), at
the paper's shapes: FoX 760M (24 heads x 64) and its d = 128 variant (12 heads x 128), T = 16384,
bf16, pruning off and on, with and without a window; each as launched on one device and as the
context-parallel ring's pair kernels launch it (``pair``: heads-major chunks, separate row and
column vectors, float32 outputs; kernels/gpu_calls.py), a chunk of --seq-len tokens against
another. For each kernel: shared memory, registers, spill bytes (``ptxas -v``), and whether
Hopper's wgmma appears in the PTX. It measures no speed.

  python benchmarks/triton_kernels_compile.py [--arch 90] [--out results/...json]
"""

import argparse
import itertools

import jax
import jax.numpy as jnp

from lpcjax.kernels import triton_backend, triton_kernels
from lpcjax.kernels.gpu_calls import Static
import compile_report  # benchmarks/ is the script's directory; shared with triton_compile.py

SMEM_LIMIT = 227 * 1024  # per block on sm_90 (opt-in maximum)
POINTERS = {"C": "*fp32", "CLO": "*fp32", "CK": "*fp32", "CKLO": "*fp32", "THR": "*fp32", "LSE": "*fp32",
            "DELTA": "*fp32", "DC": "*fp32", "SEG": "*i32", "SEGK": "*i32", "OFF": "*i32"}
# the others are q, k, v, o-shaped: the input dtype, but float32 outputs for a ring pair
PAIR_OUTPUTS = ("O", "DQ", "DK", "DV")


def parse_args():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90")
  parser.add_argument("--seq-len", type=int, default=16384)
  parser.add_argument("--shapes", nargs="+", default=["24x64", "12x128"], help="HEADSxHEAD_DIM")
  parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
  return compile_report.parse_args(parser, "triton_kernels_compile")


def ptxas_path(arch):
  """The ptxas Triton itself assembles with for this arch (its wheel ships two)."""
  from triton.backends.nvidia.compiler import get_ptxas
  return get_ptxas(arch).path


def launches(batch, seq_len, heads, head_dim, dtype, prune, window, pair=False):
  """(kernel name, constexprs, num_warps, num_stages) of every kernel one forward+backward
  launches, with the backend's own tiles and constexprs; ``pair``: as the ring launches them."""
  shape = (batch, heads, seq_len, head_dim) if pair else (batch, seq_len, heads, head_dim)
  q = jax.ShapeDtypeStruct(shape, dtype)
  sizes = triton_backend.fit_block_sizes(None, seq_len, head_dim)
  static = Static(head_dim ** -0.5, sizes, prune, window, pair=pair)
  common = triton_backend.kernel_constexprs(q, q, static)
  tiles = {"forward_kernel": (sizes.block_q, sizes.block_k),
           "dkv_kernel": (sizes.block_q_dkv, sizes.block_k_dkv),
           "dq_kernel": (sizes.block_q_dq, sizes.block_k_dq),
           "row_term_kernel": (sizes.block_q_dq, sizes.block_k_dq)}
  names = list(tiles) if dtype != jnp.float32 else list(tiles)[:3]
  for name in names:
    constexprs = dict(common, BLOCK_Q=tiles[name][0], BLOCK_K=tiles[name][1])
    if name in ("dkv_kernel", "dq_kernel"):
      constexprs["grad_scale"] = 1.0 if pair else head_dim ** -0.5
    warps, stages = triton_backend.LAUNCH_SHAPES[name][head_dim > 64]
    yield name, constexprs, warps, stages


def compile_kernel(name, constexprs, warps, stages, dtype, arch):
  import triton
  from triton.backends.compiler import GPUTarget
  from triton.compiler import ASTSource
  kernel = getattr(triton_kernels, name)
  element = {"bfloat16": "*bf16", "float16": "*fp16", "float32": "*fp32"}[jnp.dtype(dtype).name]
  pointer = lambda arg: ("*fp32" if constexprs["PAIR"] and arg in PAIR_OUTPUTS
                         else POINTERS.get(arg, element))
  signature = {arg: ("constexpr" if arg in constexprs else pointer(arg)) for arg in kernel.arg_names}
  source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
  return triton.compile(source, target=GPUTarget("cuda", arch, 32),
                        options=dict(num_warps=warps, num_stages=stages))


def main():
  args = parse_args()
  import triton
  dtype = jnp.dtype(args.dtype)
  rows = []
  print(f"triton {triton.__version__}, sm_{args.arch}, T = {args.seq_len}, {args.dtype}")
  print(f"{'kernel':>16} {'pair':>5} {'H':>3} {'D':>4} {'prune':>5} {'window':>6} {'tiles':>8} {'warps':>5} "
        f"{'stages':>6} {'smem KiB':>8} {'regs':>4} {'spill B':>7} {'wgmma':>5}")
  variants = ((False, None), (True, None), (True, 4096))  # (prune, window)
  for shape, pair, (prune, window) in itertools.product(args.shapes, args.pair, variants):
    heads, head_dim = map(int, shape.split("x"))
    for name, constexprs, warps, stages in launches(1, args.seq_len, heads, head_dim, dtype,
                                                   prune, window, pair):
      compiled = compile_kernel(name, constexprs, warps, stages, dtype, args.arch)
      ptx = compiled.asm["ptx"]
      row = {"kernel": name, "pair": pair, "heads": heads, "head_dim": head_dim, "dtype": args.dtype,
             "prune": prune, "window": window, "block_q": constexprs["BLOCK_Q"],
             "block_k": constexprs["BLOCK_K"], "num_warps": warps, "num_stages": stages,
             "smem_bytes": compiled.metadata.shared,
             "fits_smem": compiled.metadata.shared <= SMEM_LIMIT,
             "wgmma": "wgmma.mma_async" in ptx,
             **compile_report.ptxas_report(ptxas_path(args.arch), ptx, f"{args.arch // 10}.{args.arch % 10}")}
      rows.append(row)
      print(f"{name:>16} {pair!s:>5} {heads:>3} {head_dim:>4} {prune!s:>5} {window or '-'!s:>6} "
            f"{row['block_q']:>3}x{row['block_k']:<4} {warps:>5} {stages:>6} "
            f"{row['smem_bytes'] / 1024:>8.1f} {row['registers']:>4} "
            f"{row['spill_store_bytes']:>7} {row['wgmma']!s:>5}", flush=True)
  compile_report.write_report(args.out, {"triton": triton.__version__, "arch": args.arch,
                                         "seq_len": args.seq_len, "dtype": args.dtype}, rows)


if __name__ == "__main__":
  main()

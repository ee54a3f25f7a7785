"""impl="triton": the Triton kernels of triton_kernels.py called from JAX through jax-triton.

jax-triton's ``triton_call`` has no JVP or batching rule, so the four kernels sit inside the
backends' shared ``jax.custom_vjp`` (vjp.py; forward: o and lse2; backward: the row term for
bf16/fp16, then dQ and dK/dV/dc, then d log f = reverse cumsum of dc). Shapes are static, tiles come from ``BlockSizes``
(default: ``default_block_sizes``, per head dim and dtype), warps and stages are fixed per kernel: no
run-time autotuning, so every call is deterministic. GSPMD cannot partition the custom call
either: the models' sharded path wraps it in ``shard_map`` (sharded.py) as for Pallas.

jax-triton (the ``[triton]`` extra; 0.4 needs Python >= 3.12, jax >= 0.11 and triton >= 3.7;
0.3.1, which the glue also accepts, triton >= 3.6) lowers only for CUDA/ROCm: this module
imports it only when a kernel is launched, so the default install and "auto" never need it.
The launch itself is one hook, ``launcher`` (None: ``jax_triton_call``); the tests set one that
runs the same kernels under TRITON_INTERPRET on CPU torch tensors
(through ``jax.pure_callback``), which checks this glue and the kernels against the reference
without a GPU.

Grouped-query attention (gqa.py): k, v have KV_HEADS heads and every kernel reads query head
h's key/value head h // G from them (no repeat of K/V in memory). The dK/dV kernel runs one
program per (key block, batch, query head) and writes that query head's share of dK, dV in
float32; the glue sums each group's G shares (``gqa.group_sum``): during the backward, G
float32 copies of K and of V. G = 1 keeps the previous launches and outputs exactly.
"""

import inspect
import importlib.util

import jax.numpy as jnp

from . import target
from .backends import Backend, register_backend
from .block_sizes import BlockSizes, tiles_for
from .gpu_calls import LOG2_E, GpuKernels, Shapes, grad_scale, pair_kernels, single_device
from .pallas_gpu import MIN_BLOCK, SUPPORTED_HEAD_DIMS, on_gpu

INSTALL_HINT = ("forgetting_attention: impl='triton' needs jax-triton: "
                "pip install 'lpcjax[triton]' on Python >= 3.12 (jax-triton 0.4 needs "
                "jax >= 0.11 and triton >= 3.7), or use impl='pallas'")



# Tiles and (num_warps, num_stages) per kernel, by (float32 inputs, head dim > 64), chosen from what
# ptxas reports for sm_90a (benchmarks/compile_check.py, docs/compile_check.md): for bf16/fp16 the
# largest that leave every kernel without register spills, grouped K/V, windows, segments and
# pruning included (until Dec 2026 dK/dV ran 128 x 64 at d = 64 and 32 x 64 with 4 warps at
# d = 128, which spilled 4 bytes with a window and pruning). float32 inputs multiply in IEEE
# float32 on the CUDA cores (Triton's FMA dot): at the 16-bit tiles they spilled up to 82 KB and
# dQ asked 290 KiB of shared memory at d = 128, more than a block has (227), so it could not
# have launched; pallas_gpu's float32 tiles spill nothing here. The row term runs dQ's tiles.
_16_BIT_LAUNCH = {"forward_kernel": (8, 3), "dkv_kernel": (8, 3), "dq_kernel": (8, 3)}
TILES = {
    (False, False): (BlockSizes(128, 64, 64, 64, 128, 64), _16_BIT_LAUNCH),
    (False, True): (BlockSizes(128, 64, 32, 64, 128, 64), _16_BIT_LAUNCH),
    (True, False): (BlockSizes(32, 32, 16, 16, 32, 32), {"forward_kernel": (8, 2), "dkv_kernel": (4, 1),
                                                         "dq_kernel": (8, 2)}),
    (True, True): (BlockSizes(16, 32, 16, 16, 16, 16), {"forward_kernel": (8, 2), "dkv_kernel": (8, 1),
                                                        "dq_kernel": (8, 1)}),
}


def default_block_sizes(head_dim, dtype=jnp.bfloat16):
  """The default tiles for ``head_dim`` and the inputs' ``dtype`` (``TILES``)."""
  return tiles_for(TILES, head_dim, dtype)[0]

# A launcher other than jax-triton's (tests set one); None: ``jax_triton_call``.
launcher = None


def jax_triton_call(kernel_name, grid, inputs, out_types, num_warps, num_stages, constexprs,
                    compute_capability=None):
  """Launch ``triton_kernels.<kernel_name>`` through jax-triton. ``compute_capability`` (e.g. 90)
  lets a machine without a GPU lower the call; None: the GPU the kernels are built for (this
  machine's, or the absent one an ahead-of-time compile targets, target.py).

  The PTX that Triton writes is assembled by the ptxas XLA uses, which is not Triton's own:
  Triton 3.9 writes PTX ISA 9.4 for Hopper (its bundled CUDA 13.4 ptxas), which the CUDA 12.9
  ptxas of ``jax[cuda12]`` refuses ("Unsupported .version 9.4"; found by compiling for sm_90a,
  benchmarks/compile_check.py). So Triton is told the newest ISA that ptxas takes."""
  try:
    import jax_triton
  except ImportError as error:
    raise ImportError(INSTALL_HINT) from error
  from . import triton_kernels
  # jax-triton 0.4 names the outputs ``out_type``; 0.3.1 (Python 3.11+, triton 3.6, what a
  # machine whose torch pins triton 3.6 can install) names them ``out_shape``.
  parameters = inspect.signature(jax_triton.triton_call).parameters
  outputs = "out_type" if "out_type" in parameters else "out_shape"
  if compute_capability is None and (capability := target.compute_capability()) is not None:
    compute_capability = int(capability.replace(".", ""))
  isa = target.ptx_isa_version() if "backend_options" in parameters else None  # (0.3.1 has none)
  return jax_triton.triton_call(
      *inputs, kernel=getattr(triton_kernels, kernel_name), grid=grid,
      name=f"forgetting_attention_{kernel_name}", num_warps=num_warps, num_stages=num_stages,
      compute_capability=compute_capability, backend_options={"ptx_version": isa} if isa else None,
      **{outputs: out_types}, **constexprs)


def _launch(kernel_name, grid, inputs, out_types, head_dim, **constexprs):
  """``kernel_name`` launched as ``TILES`` says for its inputs (q first); the row term as dQ."""
  launch = tiles_for(TILES, head_dim, inputs[0].dtype)[1]
  warps, stages = launch["dq_kernel" if kernel_name == "row_term_kernel" else kernel_name]
  return (launcher or jax_triton_call)(kernel_name, grid, inputs, out_types, warps, stages,
                                       constexprs)


def kernel_constexprs(q, k, static):
  """The constexprs every kernel takes (WINDOW = 0: no window; PAIR for a ring pair)."""
  shapes = Shapes.of(q, k, static)
  return dict(scale2=float(static.sm_scale * LOG2_E), SEQ_Q=shapes.q_len, SEQ_K=shapes.k_len,
              HEADS=shapes.heads, KV_HEADS=shapes.heads // shapes.group, HEAD_DIM=shapes.head_dim,
              WINDOW=static.window or 0, PRUNE=static.prune, IEEE=q.dtype == jnp.float32,
              PAIR=static.pair)


def _inputs(q, k, v, ops):
  return (q, k, v, ops.c_q.hi, ops.c_q.lo, ops.seg_q, ops.c_k.hi, ops.c_k.lo, ops.seg_k,
          ops.thr.astype(jnp.float32), ops.offsets)


def _forward(q, k, v, ops, static):
  """o and lse2 [B, H, Tq] of padded inputs."""
  shapes = Shapes.of(q, k, static)
  bq, bk = static.sizes.block_q, static.sizes.block_k
  return _launch("forward_kernel", (shapes.q_len // bq, shapes.batch, shapes.heads), _inputs(q, k, v, ops),
                 (shapes.like(q, q.dtype), shapes.vector(shapes.q_len)), shapes.head_dim,
                 BLOCK_Q=bq, BLOCK_K=bk, **kernel_constexprs(q, k, static))


def _row_term(q, k, v, ops, do, lse2, static):
  """delta [B, H, Tq] recomputed from the tiles (bf16/fp16, row_term.py), on dQ's grid."""
  shapes = Shapes.of(q, k, static)
  bq, bk = static.sizes.block_q_dq, static.sizes.block_k_dq
  return _launch("row_term_kernel", (shapes.q_len // bq, shapes.batch, shapes.heads),
                 _inputs(q, k, v, ops) + (do, lse2), shapes.vector(shapes.q_len), shapes.head_dim,
                 BLOCK_Q=bq, BLOCK_K=bk, **kernel_constexprs(q, k, static))


def _backward_dq(q, k, v, ops, do, lse2, delta, static):
  shapes = Shapes.of(q, k, static)
  bq, bk = static.sizes.block_q_dq, static.sizes.block_k_dq
  return _launch("dq_kernel", (shapes.q_len // bq, shapes.batch, shapes.heads),
                 _inputs(q, k, v, ops) + (do, lse2, delta), shapes.like(q, q.dtype), shapes.head_dim,
                 BLOCK_Q=bq, BLOCK_K=bk, grad_scale=grad_scale(static), **kernel_constexprs(q, k, static))


def _backward_dkv(q, k, v, ops, do, lse2, delta, static):
  """dk, dv summed over each group's per-query-head shares, and dc [B, H, Tk]."""
  shapes = Shapes.of(q, k, static)
  bq, bk = static.sizes.block_q_dkv, static.sizes.block_k_dkv
  dk, dv, dc = _launch("dkv_kernel", (shapes.k_len // bk, shapes.batch, shapes.heads),
                       _inputs(q, k, v, ops) + (do, lse2, delta),
                       (shapes.key_shares(k), shapes.key_shares(v), shapes.vector(shapes.k_len)),
                       shapes.head_dim, BLOCK_Q=bq, BLOCK_K=bk, grad_scale=grad_scale(static),
                       **kernel_constexprs(q, k, static))
  return shapes.summed(dk, k), shapes.summed(dv, v), dc


KERNELS = GpuKernels(_forward, _row_term, _backward_dq, _backward_dkv)


def fit_block_sizes(block_sizes, seq_len, head_dim, dtype=jnp.bfloat16):
  """``block_sizes`` (default: ``default_block_sizes``) fitted to seq_len, at least 16."""
  return (block_sizes or default_block_sizes(head_dim, dtype)).fitted(seq_len, minimum=MIN_BLOCK)


def check_runnable(interpret=False):
  """One line, before anything is traced, where the kernels cannot launch: jax-triton missing,
  interpret mode asked for, or no GPU (a test's ``launcher`` stands in for all three)."""
  if launcher is not None:
    return
  try:
    import jax_triton  # noqa: F401  (fail here, in one line, not inside a trace)
  except ImportError:
    raise ImportError(INSTALL_HINT) from None
  if interpret:
    raise ValueError("forgetting_attention: impl='triton' has no interpret mode (jax-triton "
                     "lowers only for GPUs); on CPU use impl='pallas' with interpret=True")
  if not on_gpu():
    raise ValueError("forgetting_attention: impl='triton' needs a GPU; on CPU use impl='xla'")


triton_attention = single_device(KERNELS, "triton", SUPPORTED_HEAD_DIMS, fit_block_sizes, check_runnable)


# Compiled on NVIDIA GPUs only (no interpret mode), with jax-triton installed (Python >= 3.12);
# off "auto" (no priority) until GPU figures say otherwise. Its pair kernels run the ring when
# named (attention_impl="triton").
register_backend(Backend("triton", triton_attention, platforms=("gpu",), head_dims=SUPPORTED_HEAD_DIMS,
                         dtypes=("bfloat16", "float16", "float32"),
                         available=lambda: importlib.util.find_spec("jax_triton") is not None,
                         pair_kernels=pair_kernels(KERNELS, fit_block_sizes, check_runnable)))

"""Forgetting-attention speed and memory against the other attention implementations.

For each T and head dim: forward and forward+backward time (median of --iters runs after a
warm-up), TFLOP/s with causal FLOP counts (forward 0.5 * 4 * B * H * T^2 * D, backward 2.5x
that), and the compiled executable's memory (XLA memory analysis: temporaries + arguments +
outputs of forward+backward). Ratios between rows come from the same run.

Candidates: lpcjax pallas / triton (jax-triton) / mosaic_gpu (Hopper; mosaic_gpu_v1 its version 1,
mosaic_gpu_fused its one-kernel backward, mosaic_gpu_hw that's hardware-only path;
mosaic_gpu_hw_no_turns and mosaic_gpu_hw_no_early_release: that path with its forward's
warpgroups not taking turns, or not releasing K's stage early, registered for the run only, to
time what each buys) / xla /
reference backends and "auto" (what
the backend table picks here); ``*_pruned``: the same kernel with ``prune_epsilon`` at its default
(e^-10; the row also gives the share of 128 x 64 tiles the bound lets it skip on these gates, give
them a timescale with --gate-timescales); ``cudnn_nobias``: cuDNN's flash attention through
``jax.nn.dot_product_attention``, causal, no gate (the floor of softmax attention on a GPU);
``dot_product_attention_bias``: jax.nn.dot_product_attention with the decay bias materialized
as a [B, H, T, T] array (cuDNN where JAX picks it); ``pallas_mha_nobias``: JAX's Pallas causal
flash attention without any bias and with lpcjax's tiles where it allows them, its own warps
and stages (the cost floor the forget gate is measured against). On TPU: ``pallas_tpu`` (lpcjax's Mosaic kernels) and
``pallas_tpu_flash_nobias``, JAX's Pallas TPU causal flash attention without a bias, the floor
there. Candidates for another platform are skipped (docs/kernels_tpu.md).

  python benchmarks/attention.py                       # GPU: T = 1k..32k, D = 64, 128, bf16
  python benchmarks/attention.py --impls pallas_tpu pallas_tpu_flash_nobias xla   # on a TPU
  python benchmarks/attention.py --seq-lens 256 512 --head-dims 64 --batch-tokens 1024 --dtype float32
  python benchmarks/attention.py --seq-lens 16384 --head-dims 128 --gate-timescales 32 2048 \
      --impls pallas pallas_pruned triton triton_pruned                # what pruning buys

The PyTorch peers (fla, the official FoX kernel, SDPA) are timed on the same inputs by
attention_peers.py (attention_inputs.py makes both).
"""

import argparse
import dataclasses
import itertools
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp
from attention_inputs import TABLE_HEADER, attention_inputs, row_line, row_shape, timing_figures

from lpcjax.files import write_json_atomic
from lpcjax.kernels import forgetting_attention, mosaic_gpu
from lpcjax.kernels.pruning import DEFAULT_EPSILON, skipped_tile_fraction

REFERENCE_LIMIT_BYTES = 8 * 2**30  # the reference's [B, H, T, T] float32 logits must fit this


def lpcjax_candidate(impl, prune_epsilon=None):
  def attend(q, k, v, log_f):
    return forgetting_attention(q, k, v, log_f, impl=impl, prune_epsilon=prune_epsilon)
  return attend


def without(impl, feature, suffix):
  """impl="mosaic_gpu..." with one of its ``Version`` flags (``feature``) off, registered here as
  IMPL_no_SUFFIX: to time what that feature buys."""
  version = dataclasses.replace(mosaic_gpu.VERSIONS[impl], name=f"{impl}_no_{suffix}", **{feature: False})
  mosaic_gpu._register(version, priority=None)
  return lpcjax_candidate(version.name)


def dot_product_attention_bias(q, k, v, log_f):
  c = jnp.cumsum(log_f, axis=1).transpose(0, 2, 1)  # [B, H, T]
  bias = (c[..., :, None] - c[..., None, :]).astype(q.dtype)
  return jax.nn.dot_product_attention(q, k, v, bias=bias, is_causal=True)


def pallas_mha_nobias(q, k, v, log_f):
  """JAX's Pallas flash attention with lpcjax's own tiles where it allows them (its defaults use
  32 x 32 backward tiles, which would flatter the comparison). Its fused backward walks key
  blocks for dK/dV and query blocks for dQ on one grid, so its dQ query tile must equal the
  dK/dV key tile."""
  del log_f
  from jax.experimental.pallas.ops.gpu import attention as pallas_attention

  from lpcjax.kernels.pallas_gpu import default_block_sizes
  ours = default_block_sizes(q.shape[-1], q.dtype)
  tiles = pallas_attention.BlockSizes(
      block_q=ours.block_q, block_k=ours.block_k, block_q_dkv=ours.block_q_dkv,
      block_kv_dkv=ours.block_k_dkv, block_q_dq=ours.block_k_dkv, block_kv_dq=ours.block_k_dq)
  return pallas_attention.mha(q, k, v, segment_ids=None, causal=True, sm_scale=q.shape[-1] ** -0.5,
                              block_sizes=tiles)


def pallas_tpu_flash_nobias(q, k, v, log_f):
  """JAX's Pallas TPU flash attention, causal, no bias, its default tiles ([B, H, T, D])."""
  del log_f
  from jax.experimental.pallas.ops.tpu import flash_attention as tpu_flash
  heads_major = lambda x: jnp.swapaxes(x, 1, 2)
  o = tpu_flash.flash_attention(heads_major(q), heads_major(k), heads_major(v), causal=True,
                                sm_scale=q.shape[-1] ** -0.5)
  return heads_major(o)


def cudnn_nobias(q, k, v, log_f):
  """cuDNN's fused flash attention through JAX, causal, without the gate: the cost floor of
  softmax attention on this GPU."""
  del log_f
  return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")


# name -> (function, the platform it needs or None)
CANDIDATES = {
    "pallas": (lpcjax_candidate("pallas"), "gpu"),
    "pallas_pruned": (lpcjax_candidate("pallas", DEFAULT_EPSILON), "gpu"),
    "pallas_tpu": (lpcjax_candidate("pallas_tpu"), "tpu"),
    "triton": (lpcjax_candidate("triton"), "gpu"),  # jax-triton (the [triton] extra)
    "triton_pruned": (lpcjax_candidate("triton", DEFAULT_EPSILON), "gpu"),
    "mosaic_gpu": (lpcjax_candidate("mosaic_gpu"), "gpu"),  # Hopper, jax >= 0.11 (version 2)
    "mosaic_gpu_v1": (lpcjax_candidate("mosaic_gpu_v1"), "gpu"),  # version 1, kept to compare
    "mosaic_gpu_fused": (lpcjax_candidate("mosaic_gpu_fused"), "gpu"),  # version 2, the backward in one kernel
    "mosaic_gpu_hw": (lpcjax_candidate("mosaic_gpu_hw"), "gpu"),  # that's hardware-only path
    "mosaic_gpu_hw_no_turns": (without("mosaic_gpu_hw", "taking_turns", "turns"), "gpu"),
    "mosaic_gpu_hw_no_early_release": (without("mosaic_gpu_hw", "early_key_release", "early_release"), "gpu"),
    "xla": (lpcjax_candidate("xla"), None),
    "xla_pruned": (lpcjax_candidate("xla", DEFAULT_EPSILON), None),
    "auto": (lpcjax_candidate("auto"), None),
    "reference": (lpcjax_candidate("reference"), None),
    "dot_product_attention_bias": (dot_product_attention_bias, None),
    "cudnn_nobias": (cudnn_nobias, "gpu"),
    "pallas_mha_nobias": (pallas_mha_nobias, "gpu"),
    "pallas_tpu_flash_nobias": (pallas_tpu_flash_nobias, "tpu"),
}


def time_call(fn, args, iters):
  jax.block_until_ready(fn(*args))  # compile + warm up
  times = []
  for _ in range(iters):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def measure(name, batch, heads, seq_len, head_dim, dtype, iters, gate_timescale=None):
  attend, platform = CANDIDATES[name]
  if platform is not None and jax.default_backend() != platform:
    return {"skipped": f"needs a {platform.upper()}"}
  if name in ("reference", "dot_product_attention_bias") and 4 * batch * heads * seq_len**2 > REFERENCE_LIMIT_BYTES:
    return {"skipped": "the materialized [T, T] array does not fit"}
  inputs = attention_inputs(batch, seq_len, heads, head_dim, gate_timescale)
  q, k, v, do = (jnp.asarray(inputs[key], dtype) for key in ("q", "k", "v", "do"))
  log_f = jnp.asarray(inputs["log_f"])
  forward = jax.jit(attend)

  @jax.jit
  def forward_backward(q, k, v, log_f):
    out, vjp = jax.vjp(attend, q, k, v, log_f)
    return out, vjp(do)

  try:
    compiled = forward_backward.lower(q, k, v, log_f).compile()
    memory = compiled.memory_analysis()
    fwd_s = time_call(forward, (q, k, v, log_f), iters)
    fwd_bwd_s = time_call(forward_backward, (q, k, v, log_f), iters)
  except Exception as error:  # a candidate that cannot run this shape is reported, not fatal
    return {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
  return {**timing_figures(batch, heads, seq_len, head_dim, fwd_s, fwd_bwd_s),
          "memory_bytes": int(memory.temp_size_in_bytes + memory.argument_size_in_bytes + memory.output_size_in_bytes)}


def skipped_fraction(batch, heads, seq_len, head_dim, gate_timescale):
  """The share of causal 128 x 64 tiles that pruning may skip on a row's inputs (the bound of
  kernels/pruning.py, counted, not timed; one head)."""
  inputs = attention_inputs(batch, seq_len, heads, head_dim, gate_timescale)
  one_head = lambda x: jnp.asarray(x[:1, :, :1])
  return skipped_tile_fraction(one_head(inputs["q"]), one_head(inputs["k"]), one_head(inputs["log_f"]),
                               block_q=128, block_k=64)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seq-lens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384, 32768])
  parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
  parser.add_argument("--batch-tokens", type=int, default=32768, help="batch = max(1, batch_tokens // T)")
  parser.add_argument("--model-dim", type=int, default=2048, help="heads = model_dim // head_dim")
  parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
  parser.add_argument("--gate-timescales", type=float, nargs="+", default=[None],
                      help="gates of these decay times, in turn (attention_inputs.py; default: f uniform in [0.9, 1))")
  parser.add_argument("--impls", nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES))
  parser.add_argument("--iters", type=int, default=10)
  parser.add_argument("--out", default=None)
  args = parser.parse_args()

  out = args.out or os.path.join(os.path.dirname(__file__), "results", f"attention_{jax.default_backend()}.json")
  rows = []
  print(f"device: {jax.devices()[0].device_kind}  jax {jax.__version__}  dtype {args.dtype}  "
        f"gate timescales {args.gate_timescales}")
  print(TABLE_HEADER)
  for gate_timescale, head_dim, seq_len in itertools.product(args.gate_timescales, args.head_dims, args.seq_lens):
    batch, heads = row_shape(seq_len, head_dim, args.batch_tokens, args.model_dim)
    for name in args.impls:
      result = measure(name, batch, heads, seq_len, head_dim, jnp.dtype(args.dtype), args.iters, gate_timescale)
      row = {"candidate": name, "batch": batch, "heads": heads, "seq_len": seq_len, "head_dim": head_dim,
             "gate_timescale": gate_timescale, **result}
      if name.endswith("_pruned") and "forward_ms" in result:
        row["skipped_tile_fraction"] = skipped_fraction(batch, heads, seq_len, head_dim, gate_timescale)
      rows.append(row)
      print(row_line(row), flush=True)
      # After every row: a run cut short keeps what it measured.
      write_json_atomic(out, {
          "device": jax.devices()[0].device_kind, "backend": jax.default_backend(),
          "jax_version": jax.__version__, "python": platform.python_version(), "dtype": args.dtype,
          "flops": "causal: forward 0.5*4*B*H*T^2*D, forward+backward 3.5x forward", "rows": rows})
  print(f"wrote {out}")


if __name__ == "__main__":
  main()

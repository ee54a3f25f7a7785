"""Forgetting attention, forward and backward, compiled for a chip that is absent.

One ``AttentionCase`` is one call of ``forgetting_attention`` (backend, dtype, head dim, length,
heads, grouped K/V, window, segments, pruning), compiled ahead of time together with its
gradient in q, k, v and log f (so every kernel of the backend is built: forward, row term, dQ,
dK/dV) for one compile-only device (``targets.compile_only_devices``); with ``context`` > 1, the
context-parallel ring over that many devices, whose pair kernels are then the ones built. ``compile_attention``
returns a row: whether it compiled (else the compiler's message, naming the backend and the
target), how long it took, and each kernel's resources (``compiler_reports``).
"""

import contextlib
import dataclasses
import time
from typing import Optional

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

from lpcjax.kernels import forgetting_attention
from lpcjax.kernels.context_parallel import ring_attention
from lpcjax.kernels.target import building_for

from .compiler_reports import GpuDumps, tpu_reports
from .targets import COMPILER_OPTIONS, no_compilation_cache

PRUNE_EPSILON = 1e-4  # a pruning threshold as a user sets it (e^-10 in the ACP paper is 4.5e-5)


@dataclasses.dataclass(frozen=True)
class AttentionCase:
  impl: str
  dtype: str = "bfloat16"
  head_dim: int = 128
  seq_len: int = 2048
  heads: int = 4
  kv_heads: Optional[int] = None  # None: as many as query heads
  window: Optional[int] = None
  segments: bool = False
  prune: bool = False
  batch: int = 1
  context: int = 1  # > 1: the ring over this many devices (kernels/context_parallel.py)

  @property
  def name(self):
    parts = [self.impl, self.dtype, f"D{self.head_dim}", f"T{self.seq_len}", f"H{self.heads}"]
    if self.kv_heads and self.kv_heads != self.heads:
      parts.append(f"gqa{self.heads // self.kv_heads}")
    parts += [f"window{self.window}"] * (self.window is not None) + ["segments"] * self.segments + [
        "pruned"] * self.prune + [f"ring{self.context}"] * (self.context > 1)
    return "-".join(parts)

  def mesh(self, devices):
    return jax.make_mesh((self.context,), ("context",), devices=devices[:self.context],
                         axis_types=(jax.sharding.AxisType.Auto,))

  def arguments(self, devices):
    """Abstract q, k, v, log f (and segment ids) on the first device, or split along the
    sequence over ``context`` devices."""
    if self.context > 1:
      sharding = NamedSharding(self.mesh(devices), P(None, "context"))
    else:
      sharding = SingleDeviceSharding(devices[0])
    put = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
    kv_heads = self.kv_heads or self.heads
    q = put((self.batch, self.seq_len, self.heads, self.head_dim), jnp.dtype(self.dtype))
    kv = put((self.batch, self.seq_len, kv_heads, self.head_dim), jnp.dtype(self.dtype))
    args = [q, kv, kv, put((self.batch, self.seq_len, self.heads), jnp.float32)]
    if self.segments:
      args.append(put((self.batch, self.seq_len), jnp.int32))
    return args

  def loss(self, devices):
    """sum(o) as a function of the arguments: its gradient runs every backward kernel."""
    options = dict(impl=self.impl, window=self.window, prune_epsilon=PRUNE_EPSILON if self.prune else None)
    attend = lambda q, k, v, log_f, segment_ids: forgetting_attention(q, k, v, log_f, segment_ids=segment_ids,
                                                                      **options)
    if self.context > 1:
      split = P(None, "context")

      def attend(q, k, v, log_f, segment_ids):
        ring = lambda *args: ring_attention(*args, axis_name="context", axis_size=self.context, **options)
        args = (q, k, v, log_f) + ((segment_ids,) if segment_ids is not None else ())
        return jax.shard_map(ring, mesh=self.mesh(devices), in_specs=split, out_specs=split,
                             check_vma=False)(*args)

    def loss(q, k, v, log_f, segment_ids=None):
      return jnp.sum(attend(q, k, v, log_f, segment_ids).astype(jnp.float32))
    return loss


def first_line(error):
  """The compiler's message in one line: the first line that says what failed."""
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  telling = [line for line in lines if any(word in line for word in ("rror", "failed", "fatal", "Bad", "xceed"))]
  return (telling or lines or [type(error).__name__])[0][:400]


def compile_attention(case, devices, reports=True, xla_triton_smem=False):
  """Compile ``case``'s forward (alone, and as the gradient runs it) and backward for ``devices``
  (one compile-only device, or a list holding at least ``case.context``); a dict row: the case's fields,
  ``target`` (the device kind), ``compiled``, ``error`` (one line naming backend, target and the
  compiler's message) or ``kernels`` (KernelReport dicts, with ``reports``), ``seconds``.
  ``xla_triton_smem``: also read the Pallas kernels' shared memory (costly, and it slows every
  later compile of the process: ``compiler_reports.GpuDumps``)."""
  devices = list(devices) if isinstance(devices, (list, tuple)) else [devices]
  device = devices[0]
  row = {**dataclasses.asdict(case), "case": case.name, "target": device.device_kind}
  loss = case.loss(devices)
  argnums = tuple(range(4))
  start = time.perf_counter()
  dumps = GpuDumps(xla_triton_smem=xla_triton_smem) if device.platform == "gpu" and reports else None
  try:
    # Mosaic GPU writes a kernel's resources when it is lowered, its PTX when it is compiled
    with dumps or contextlib.nullcontext(), building_for(device), jax.default_device(device), no_compilation_cache():
      # the output alone (inference: a backend may run another forward kernel under a gradient,
      # as mosaic_gpu's two-part forward) and the gradient, which runs every backward kernel
      both = lambda *args: (loss(*args), jax.value_and_grad(loss, argnums=argnums)(*args))
      lowered = jax.jit(both).trace(*case.arguments(devices)).lower()
      compiled = lowered.compile({**COMPILER_OPTIONS, **(dumps.compiler_options if dumps else {})})
      kernels = dumps.reports(compiled.as_text()) if dumps else []
      if device.platform == "tpu" and reports:
        kernels = tpu_reports(compiled.as_text())
  except Exception as error:  # the compiler's message is the result
    row.update(compiled=False, seconds=round(time.perf_counter() - start, 1),
               error=f"impl={case.impl!r} for {device.device_kind}: {first_line(error)}")
    return row
  row.update(compiled=True, seconds=round(time.perf_counter() - start, 1),
             kernels=[kernel.as_dict() for kernel in kernels])
  return row

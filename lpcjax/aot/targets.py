"""Chips that are not here, described to JAX so that it compiles for them on a CPU machine.

JAX compiles ahead of time for a described target (``jax.experimental.topologies``): a GPU
from a target config (XLA's ``GpuTargetConfigProto``, in text form), a TPU from libtpu's
topology names. Nothing runs; the compile is the real one (XLA's GPU pipeline and ptxas, Mosaic
GPU's passes, libtpu's Mosaic compiler), so what it rejects the chip would reject.

The GPU target configs are written here from the chips' public specifications (NVIDIA's data
sheets and the CUDA programming guide's per-architecture limits), not copied from XLA's spec
files. What XLA reads from them: the compute capability (sm_90a for Hopper, with its
accelerated features: wgmma, TMA), the SM count and limits (threads, shared memory per block and
per SM, registers) and, for its cost model, clock, memory bandwidth and L2.

Targets are named like ``h100`` (one GPU), ``h100x8`` (one process with 8), ``2xh100x8`` (2
processes of 8), ``v5e`` / ``v5e-8`` (TPU chips), ``v6e-8``, ``v5p-8``.

Needs the compilers, not the chips: ``pip install "lpcjax[aot]"`` (Python >= 3.12), and JAX
started with ``JAX_PLATFORMS=cpu`` or with ``JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1`` (set by this
module when it is imported before JAX starts its backends), otherwise the CUDA plugin refuses to
load on a machine without a driver.
"""

import dataclasses
import os
import re

os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
# libtpu holds /tmp/libtpu_lockfile for the process that has it loaded, and refuses a second
# (two test workers, two benchmark processes): nothing here uses a TPU, so they may share it.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

from lpcjax.errors import UserError  # noqa: E402  (after the environment JAX's plugins read)

from .compiler_reports import Toolchain  # noqa: E402

GiB = 2**30


class TargetError(UserError, ValueError):
  """A target name that is not known, or compilers for it that are not installed."""


@dataclasses.dataclass(frozen=True)
class GpuChip:
  """A GPU's public specification, as much of it as XLA's target config holds."""

  name: str  # the device kind it reports
  sm_count: int
  clock_ghz: float  # boost clock
  memory_bytes: int
  memory_bandwidth: int  # bytes/s
  l2_bytes: int
  capability: tuple = (9, 0)
  smem_per_sm: int = 228 * 1024  # Hopper: 228 KiB of shared memory per SM ...
  smem_per_block_optin: int = 227 * 1024  # ... of which one block may opt in to 227 KiB
  registers_per_sm: int = 65536
  threads_per_sm: int = 2048
  fp32_lanes_per_sm: int = 128
  nvlink_links: int = 18
  peak_bf16_tflops: float = 989.0  # dense, SXM


# NVIDIA H100 and H200 data sheets (SXM): 132 SMs at up to 1.98 GHz, 50 MB of L2; HBM3 80 GB at
# 3.35 TB/s, HBM3e 141 GB at 4.8 TB/s. Memory sizes are the data sheets' (GB = 1e9 bytes for
# the H200's 141 GB; the H100's 80 GB is 80 GiB of HBM3); a process sees slightly less.
GPU_CHIPS = {
    "h100": GpuChip("NVIDIA H100 80GB HBM3", sm_count=132, clock_ghz=1.98, memory_bytes=80 * GiB,
                    memory_bandwidth=3_350_000_000_000, l2_bytes=50 * 2**20),
    "h200": GpuChip("NVIDIA H200", sm_count=132, clock_ghz=1.98, memory_bytes=141_000_000_000,
                    memory_bandwidth=4_800_000_000_000, l2_bytes=50 * 2**20),
}


@dataclasses.dataclass(frozen=True)
class TpuChip:
  topology_prefix: str  # libtpu's topology name prefix
  memory_bytes: int  # HBM per chip
  dims: int  # 2 (v5e, v6e: a 2-D torus) or 3 (v5p)
  peak_bf16_tflops: float
  vmem_bytes: int  # VMEM per core
  scoped_vmem_bytes: int  # the VMEM a kernel may use without raising its vmem_limit_bytes


# HBM and peak bf16 per chip: Cloud TPU's system architecture pages. VMEM and the default scoped
# limit: measured with libtpu 0.0.48.1 by compiling kernels that ask for more ("would exceed
# memory (size=...)", "CompileTimeScopedVmemOom"), docs/compile_check.md.
TPU_CHIPS = {
    "v5e": TpuChip("v5e", 16 * GiB, 2, 197.0, vmem_bytes=128 * 2**20, scoped_vmem_bytes=16 * 2**20),
    "v6e": TpuChip("v6e", 32 * GiB, 2, 918.0, vmem_bytes=128 * 2**20, scoped_vmem_bytes=32 * 2**20),
    "v5p": TpuChip("v5p", 95 * GiB, 3, 459.0, vmem_bytes=64 * 2**20, scoped_vmem_bytes=16 * 2**20),
}

# chips -> the libtpu topology of that many chips (one host up to 8 on v5e/v6e, 4 on v5p)
_TPU_SHAPES = {2: {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 256: "16x16"},
               3: {1: "1x1x1", 4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4"}}


@dataclasses.dataclass(frozen=True)
class Target:
  """A named set of compile-only devices: ``kind`` ("gpu" or "tpu"), ``chip`` (a key of
  GPU_CHIPS or TPU_CHIPS), ``processes`` x ``devices_per_process`` devices."""

  name: str
  kind: str
  chip: str
  processes: int
  devices_per_process: int

  @property
  def num_devices(self):
    return self.processes * self.devices_per_process

  @property
  def spec(self):
    return (GPU_CHIPS if self.kind == "gpu" else TPU_CHIPS)[self.chip]

  @property
  def memory_bytes(self):
    return self.spec.memory_bytes


def parse_target(name):
  """The ``Target`` named ``name``: ``[P x]<gpu>[xN]`` (h100, h100x8, 2xh100x8) or
  ``<tpu>[-N]`` (v5e, v5e-8, v6e-8, v5p-8: N chips); a TargetError otherwise."""
  text = name.strip().lower()
  gpu = re.fullmatch(r"(?:(\d+)x)?([a-z]\d+)(?:x(\d+))?", text)
  if gpu and gpu.group(2) in GPU_CHIPS:
    processes, per_process = int(gpu.group(1) or 1), int(gpu.group(3) or 1)
    if processes < 1 or per_process < 1:
      raise TargetError(f"target {name!r}: counts must be at least 1")
    return Target(name, "gpu", gpu.group(2), processes, per_process)
  tpu = re.fullmatch(r"(v\d+[a-z])(?:-(\d+))?", text)
  if tpu and tpu.group(1) in TPU_CHIPS:
    chips, chip = int(tpu.group(2) or 1), TPU_CHIPS[tpu.group(1)]
    if chips not in _TPU_SHAPES[chip.dims]:
      raise TargetError(f"target {name!r}: {tpu.group(1)} slices of {sorted(_TPU_SHAPES[chip.dims])} chips are known")
    per_host = min(chips, 8 if chip.dims == 2 else 4)
    return Target(name, "tpu", tpu.group(1), chips // per_host, per_host)
  known = sorted(GPU_CHIPS) + [f"{g}x8" for g in sorted(GPU_CHIPS)] + ["2xh100x8"] + sorted(TPU_CHIPS) + [
      f"{t}-8" for t in sorted(TPU_CHIPS)]
  raise TargetError(f"unknown target {name!r}; targets look like {', '.join(known)}")


def gpu_target_config(chip):
  """XLA's GpuTargetConfigProto for ``chip`` (a GpuChip), in protobuf text form."""
  major, minor = chip.capability
  # sm_90a: Hopper's architecture-specific features (wgmma, setmaxnreg) need the "a" target
  accelerated = "\n    feature_extension: ACCELERATED_FEATURES" if major == 9 else ""
  return f"""gpu_device_info {{
  name: "{chip.name}"
  device_vendor: "NVIDIA Corporation"
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_block_optin: {chip.smem_per_block_optin}
  shared_memory_per_core: {chip.smem_per_sm}
  threads_per_core_limit: {chip.threads_per_sm}
  core_count: {chip.sm_count}
  fpus_per_core: {chip.fp32_lanes_per_sm}
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  thread_dim_limit_x: 1024
  thread_dim_limit_y: 1024
  thread_dim_limit_z: 64
  memory_bandwidth: {chip.memory_bandwidth}
  l2_cache_size: {chip.l2_bytes}
  clock_rate_ghz: {chip.clock_ghz}
  device_memory_size: {chip.memory_bytes}
  registers_per_core_limit: {chip.registers_per_sm}
  registers_per_block_limit: 65536
  device_address_bits: 64
  device_interconnect_info {{ active_links: {chip.nvlink_links} }}
  cuda_compute_capability {{
    major: {major}
    minor: {minor}{accelerated}
  }}
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 10 }}
device_description_str: "{chip.name}"
"""


def compile_only_devices(target):
  """The ``Target``'s (or target name's) devices: JAX devices that exist only to be compiled
  for, in process-major order. A TargetError names what is missing when the compilers are not
  installed."""
  target = parse_target(target) if isinstance(target, str) else target
  from jax.experimental import topologies
  try:
    if target.kind == "gpu":
      Toolchain.find().use_for_compiles()  # one ptxas for XLA and Mosaic GPU, whatever CUDA is here
      topology = topologies.get_topology_desc(
          platform="cuda", target_config=gpu_target_config(target.spec),
          topology=f"1x{target.processes}x{target.devices_per_process}")
    else:
      chip = target.spec
      shape = _TPU_SHAPES[chip.dims][target.num_devices]
      bounds = {} if target.processes > 1 else {"chips_per_host_bounds": tuple(
          int(n) for n in (shape + "x1" if chip.dims == 2 else shape).split("x"))}
      topology = topologies.get_topology_desc(topology_name=f"{chip.topology_prefix}:{shape}", platform="tpu",
                                              **bounds)
  except (NotImplementedError, RuntimeError, ValueError) as error:
    package = "jax-cuda12-plugin" if target.kind == "gpu" else "libtpu"
    raise TargetError(f"target {target.name}: no {target.kind.upper()} compiler here ({package} for this jax: "
                      f"pip install 'lpcjax[aot]', Python >= 3.12; start JAX with JAX_PLATFORMS=cpu): "
                      f"{str(error).splitlines()[0]}") from None
  return sorted(topology.devices, key=lambda d: (d.process_index, d.id))


# XLA's own defaults, said explicitly for every compile for a target, so that a process's XLA_FLAGS
# cannot change the code: the test suite's --xla_backend_optimization_level=0 (its CPU compiles
# are faster) made Pallas' dQ kernel spill 28 bytes that the default level does not.
COMPILER_OPTIONS = {"xla_backend_optimization_level": 3}


def no_compilation_cache():
  """A context in which JAX's persistent compilation cache is off. It cannot store what is
  compiled for compile-only devices (jax 0.11.2: "'Executable' object has no attribute
  'local_devices'"), and a run that set JAX_COMPILATION_CACHE_DIR would fail every compile."""
  from jax._src import config  # the flag's context manager is only reachable here
  return config.enable_compilation_cache(False)

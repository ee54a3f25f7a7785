"""Compile the two peer forgetting-attention Triton kernels for an H100 (sm_90a) on a CPU; report their resources.

The peers, loaded at run time from outside the project (nothing of theirs is copied here):

* ``fox_official``: the FoX authors' kernel, ``forgetting_attention`` of zhixuan-lin/forgetting-transformer
  (src/forgetting_transformer/ops/forgetting_attention.py): forward, bwd preprocess (delta), dkv and dq kernels;
  ``--fox-adaptive`` adds its adaptive computation pruning (variant "acp": adaptive_threshold set, so
  the find-index kernels and IS_ADAPTIVE=True);
* ``fla``: ``parallel_forgetting_attn`` of flash-linear-attention (fla.ops.attn.parallel's Triton kernels and
  the chunk_global_cumsum kernels it launches for the gate). Only its Triton path: on a Hopper GPU with
  triton >= 3.4 fla sends ``parallel_attn`` fwd/bwd to TileLang when the ``tilelang`` package is installed
  (FLA_TILELANG=0 turns that off); that path is not compiled here.

How the launches are found: each peer's own Python entry point runs on PyTorch "meta" tensors (shapes and
strides, no data) while every Triton kernel object of its modules is replaced by a recorder, so the block
sizes, warps and stages are the ones the peer's code picks for an H100. It believes it runs on one because
``torch.cuda.get_device_capability`` answers (9, 0) (the official kernel's get_*_config) and fla's
``get_all_max_shared_mem`` answers 232448 bytes, an H100's opt-in shared memory per block (what
``check_shared_mem('hopper')`` compares). Each recorded launch is then compiled with ``triton.compile`` exactly
as Triton's launcher would specialise it (its binder: pointers 16-byte aligned, as PyTorch's CUDA allocations
are; ints equal to 1 or divisible by 16), the heuristics evaluated as ``triton.heuristics`` does, and EVERY
config of an autotuner's list (after prune_configs_by, if any): the autotuner picks among them on the GPU
at run time. PTX version 8.8, so that CUDA 12.9's ptxas takes it; registers, spills and the SASS of the
tensor-core loops come from lpcjax.aot.compiler_reports (ptxas -v, nvdisasm). These are compiler counts,
not speed.

Getting the official source (a bare mirror of the repository; any checkout works):

  mkdir -p /tmp/fox_official && git --git-dir=<mirror> archive HEAD src | tar -x -C /tmp/fox_official
  python benchmarks/compile_peers.py --fox-official-src /tmp/fox_official/src \\
      --fox-official-commit $(git --git-dir=<mirror> rev-parse HEAD)

  options: --seq-len 16384 --head-dim 128 --heads 16 --batch 1 --dtype bfloat16 --fox-adaptive --all-configs
           --out benchmarks/results/compile_peers_sm90.json
Exit status 1 when a kernel did not compile (its row carries the error).
"""

import argparse
import contextlib
import dataclasses
import datetime
import hashlib
import importlib.metadata
import importlib.util
import os
import platform
import shlex
import sys
import warnings
from typing import Optional
from unittest import mock

ARCH = 90  # compute capability 9.0: Triton compiles sm_90a for it
PTX_VERSION = 88  # PTX ISA 8.8, the newest that the CUDA 12.9 ptxas of lpcjax's toolchain accepts
H100_MAX_SMEM = 232448  # bytes: an H100's (and H200's) cudaDevAttrMaxSharedMemoryPerBlockOptin
TILES = {"fox_official": ("BLOCK_M", "BLOCK_N"), "fla": ("BT", "BS", "BK", "BV")}  # reported with each config
OFFICIAL_FILE = os.path.join("forgetting_transformer", "ops", "forgetting_attention.py")
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def parse_args():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--fox-official-src", required=True,
                      help="the official repository's src folder (or the repository, or the kernel file itself)")
  parser.add_argument("--fox-official-commit", help="the commit the source was taken from, for the record")
  parser.add_argument("--fox-adaptive", action="store_true",
                      help="also the official kernel's adaptive computation pruning (adaptive_threshold set)")
  parser.add_argument("--seq-len", type=int, default=16384)
  parser.add_argument("--head-dim", type=int, default=128)
  parser.add_argument("--heads", type=int, default=16)
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
  parser.add_argument("--all-configs", action="store_true",
                      help="print every autotune config (the JSON always has them all), not one line per kernel")
  parser.add_argument("--out", default=os.path.join(RESULTS, "compile_peers_sm90.json"))
  return parser.parse_args()


# ----------------------------------------------------------------------------- recording the launches


@dataclasses.dataclass
class Launch:
  """One kernel launch a peer made: ``kernel`` is the launched object (a JITFunction, or the
  triton.heuristics / triton.autotune wrappers around one), with the arguments it was given."""

  peer: str
  variant: str
  phase: str  # "forward" or "backward"
  kernel: object
  args: tuple
  kwargs: dict


class _Recorder:
  """Stands in for one Triton kernel in its module: ``kernel[grid](...)`` (or ``kernel.run``) records
  the launch instead of running it, so that the peer's own code decides every argument."""

  def __init__(self, kernel, sink):
    self.kernel, self.sink = kernel, sink

  def __getitem__(self, grid):
    return lambda *args, **kwargs: self.sink(self.kernel, args, kwargs)

  def run(self, *args, grid=None, warmup=False, **kwargs):
    self.sink(self.kernel, args, kwargs)


@contextlib.contextmanager
def recording(modules, sink):
  """Every Triton kernel object in ``modules`` replaced by a _Recorder while inside. Nothing is
  compiled inside, so the device functions the kernels call can be replaced too without harm."""
  from triton.runtime.jit import KernelInterface
  with contextlib.ExitStack() as stack:
    for module in modules:
      kernels = {name: value for name, value in vars(module).items() if isinstance(value, KernelInterface)}
      if kernels:
        stack.enter_context(mock.patch.multiple(module, **{n: _Recorder(k, sink) for n, k in kernels.items()}))
    yield


class _Launches:
  """The launches of one peer, each tagged with the phase (forward/backward) it happened in."""

  def __init__(self, peer, variant):
    self.peer, self.variant, self.phase, self.items = peer, variant, "forward", []

  def __call__(self, kernel, args, kwargs):
    self.items.append(Launch(self.peer, self.variant, self.phase, kernel, args, dict(kwargs)))


def meta_inputs(args):
  """q, k, v and log f as meta tensors that require grad, (batch, time, heads, ...): both peers' default
  layout (the official one transposes it to heads-first as strided views, no copy)."""
  import torch
  dtype = getattr(torch, args.dtype)
  shape = (args.batch, args.seq_len, args.heads, args.head_dim)
  q, k, v = (torch.empty(shape, dtype=dtype, device="meta", requires_grad=True) for _ in range(3))
  log_f = torch.empty(shape[:3], dtype=torch.float32, device="meta", requires_grad=True)
  return q, k, v, log_f


def run_both_phases(launches, forward):
  """forward() -> output; then its backward with a meta cotangent, phases tagged."""
  import torch
  launches.phase = "forward"
  out = forward()
  launches.phase = "backward"
  out.backward(torch.empty_like(out))


# ----------------------------------------------------------------------------- the peers


def official_file(src):
  """The official kernel file under ``src`` (the src folder, the repository, or the file itself)."""
  for path in (src, os.path.join(src, OFFICIAL_FILE), os.path.join(src, "src", OFFICIAL_FILE)):
    if os.path.isfile(path):
      return os.path.abspath(path)
  raise FileNotFoundError(f"no {OFFICIAL_FILE} under {src}")


def load_official(path):
  """The kernel file as a module of its own: importing its package would pull in the whole model."""
  spec = importlib.util.spec_from_file_location("fox_official_forgetting_attention", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def official_launches(module, args, adaptive):
  """The official kernel's launches for one forward + backward on an "H100": its get_fwd_config /
  get_bwd_kv_config / get_bwd_q_config ask torch.cuda for the capability, which answers (9, 0)."""
  import torch
  launches = _Launches("fox_official", "acp" if adaptive else "default")
  q, k, v, log_f = meta_inputs(args)
  threshold = -10.0 if adaptive else None  # a runtime value: any float compiles the same kernels
  forward = lambda: module.forgetting_attention(q, k, v, log_f, adaptive_threshold=threshold)
  with mock.patch.object(torch.cuda, "get_device_capability", return_value=(ARCH // 10, ARCH % 10)), \
       recording([module], launches):
    run_both_phases(launches, forward)
  return launches.items


def import_fla():
  """fla's forgetting attention, with its CPU-platform warning silenced; TileLang off (Triton only)."""
  os.environ.setdefault("FLA_TILELANG", "0")
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fla.ops.forgetting_attn.parallel import parallel_forgetting_attn
  return parallel_forgetting_attn


class _EveryDevice:
  """A per-device list that holds one value for every index, None included: fla indexes it with
  ``q.device.index``, which is None for a meta tensor where a CUDA tensor's is 0."""

  def __init__(self, value):
    self.value = value

  def __getitem__(self, index):
    return self.value


@contextlib.contextmanager
def fla_on_hopper():
  """fla's hardware probe answering as an H100: ``check_shared_mem(arch, index)`` compares the
  device's max_shared_mem with a per-architecture threshold and is cached, so its cache is cleared
  around."""
  import fla.utils.hardware as hardware
  hardware.check_shared_mem.cache_clear()
  try:
    with mock.patch.object(hardware, "get_all_max_shared_mem", return_value=_EveryDevice(H100_MAX_SMEM)):
      yield
  finally:
    hardware.check_shared_mem.cache_clear()


def fla_launches(args):
  """fla's launches for one forward + backward of parallel_forgetting_attn on an "H100"."""
  attention = import_fla()
  launches = _Launches("fla", "default")
  q, k, v, log_f = meta_inputs(args)
  modules = [m for name, m in list(sys.modules.items()) if m is not None and (name == "fla" or name.startswith("fla."))]
  with fla_on_hopper(), recording(modules, launches):
    run_both_phases(launches, lambda: attention(q, k, v, log_f))
  return launches.items


# ----------------------------------------------------------------------------- compiling


@dataclasses.dataclass
class Candidate:
  """One compilable (kernel, arguments) of a launch; ``choice`` says who picked its config."""

  launch: Launch
  jit_fn: object
  kwargs: dict
  choice: str
  autotune_list: Optional[str] = None  # which list, how many configs, whether pruned
  autotune_index: Optional[int] = None


def candidates(launch):
  """What a launch can run as: the heuristics evaluated as Heuristics.run does (each sees the ones
  before it), and one candidate per config of an autotuner (after its prune_configs_by), since the
  autotuner picks among them on the GPU at run time."""
  from triton.runtime.autotuner import Autotuner, Heuristics
  from triton.runtime.jit import JITFunction

  def walk(node, kwargs, autotune):
    if isinstance(node, Heuristics):
      kwargs = dict(kwargs)
      for name, rule in node.values.items():
        kwargs[name] = rule({**dict(zip(node.arg_names, launch.args)), **kwargs})
      yield from walk(node.fn, kwargs, autotune)
    elif isinstance(node, Autotuner):
      configs, how = autotune_configs(node, launch.args, kwargs)
      for i, config in enumerate(configs):
        yield from walk(node.fn, {**kwargs, **config.all_kwargs()}, (how, i))
    elif isinstance(node, JITFunction):
      if autotune is None:
        yield Candidate(launch, node, kwargs, "fixed by the peer's launch code")
      else:
        yield Candidate(launch, node, kwargs, "autotune candidate: the autotuner picks one at run time on the GPU",
                        *autotune)
    else:
      raise TypeError(f"unknown kernel wrapper {type(node).__name__}")

  yield from walk(launch.kernel, launch.kwargs, None)


def autotune_configs(autotuner, args, kwargs):
  """(configs, description) of an autotuner: all of its list, or what its prune_configs_by keeps."""
  configs = list(autotuner.configs)
  if autotuner.early_config_prune or autotuner.perf_model:
    autotuner.nargs = dict(zip(autotuner.arg_names, args))
    kept = autotuner.prune_configs(kwargs)
    return kept, f"list of {len(configs)} configs, {len(kept)} kept by prune_configs_by"
  return configs, f"list of {len(configs)} configs, no prune_configs_by"


def prepare(jit_fn, args, kwargs):
  """(ASTSource, options) as JITFunction.run builds them for these arguments: the binder's
  specialisation of each argument (meta tensors report data_ptr 0: aligned, like a CUDA allocation)."""
  from triton.backends.compiler import GPUTarget
  from triton.compiler import ASTSource, make_backend
  from triton.runtime.jit import create_function_from_signature
  backend = make_backend(GPUTarget("cuda", ARCH, 32))
  binder = create_function_from_signature(jit_fn.signature, jit_fn.params, backend)
  kwargs = {**kwargs, "ptx_version": PTX_VERSION}
  bound, specialization, options = binder(*args, **kwargs)
  options, signature, constexprs, attrs = jit_fn._pack_args(backend, kwargs, bound, specialization, options)
  return ASTSource(jit_fn, signature, constexprs, attrs), options


def config_of(candidate, options):
  """The block sizes the peer names as its tiles, and warps and stages (Triton's defaults where unset)."""
  tiles = {name: candidate.kwargs[name] for name in TILES[candidate.launch.peer] if name in candidate.kwargs}
  return {**tiles, "num_warps": options.num_warps, "num_stages": options.num_stages}


def compile_row(candidate, toolchain):
  """One JSON row: the candidate compiled for sm_90a and assembled by lpcjax's ptxas, or its error."""
  import triton
  from triton.backends.compiler import GPUTarget
  from lpcjax.aot.compiler_reports import KernelReport, sass_mix
  launch = candidate.launch
  row = {"peer": launch.peer, "variant": launch.variant, "phase": launch.phase, "kernel": candidate.jit_fn.__name__,
         "choice": candidate.choice}
  if candidate.autotune_index is not None:
    row.update(autotune_list=candidate.autotune_list, autotune_index=candidate.autotune_index)
  try:
    source, options = prepare(candidate.jit_fn, launch.args, candidate.kwargs)
    row["config"] = config_of(candidate, options)
    compiled = triton.compile(source, target=GPUTarget("cuda", ARCH, 32), options=options.__dict__)
    resources, sass = toolchain.assemble(compiled.asm["ptx"], compiled.metadata.name)
    report = KernelReport(compiled.metadata.name, "triton", smem_bytes=compiled.metadata.shared,
                          threads=32 * compiled.metadata.num_warps, loops=sass_mix(sass) if sass else None,
                          **resources)
    return {**row, "compiled": True, "fits_smem": compiled.metadata.shared <= H100_MAX_SMEM, **report.as_dict()}
  except Exception as error:  # a kernel that does not compile is a row, not the end of the run
    message = (str(error).strip().splitlines() or [""])[0]
    return {**row, "compiled": False, "error": f"{type(error).__name__}: {message}"[:300]}


# ----------------------------------------------------------------------------- the table


def lightest_loop(row):
  """(instructions, tensor instructions) of the tensor-core loop with the fewest instructions."""
  loops = row.get("loops") or []
  if not loops:
    return None
  loop = min(loops, key=lambda mix: mix["total"])
  return loop["total"], loop.get("tensor", 0)


def spread(values, fmt="{}"):
  """"a" or "a-b" over the values."""
  values = [v for v in values if v is not None]
  if not values:
    return "-"
  low, high = fmt.format(min(values)), fmt.format(max(values))
  return low if low == high else f"{low}-{high}"


def table_line(peer, phase, kernel, config, rows):
  """One table line over ``rows`` (one kernel, or all configs of one autotuned kernel)."""
  done = [r for r in rows if r["compiled"]]
  loops = [lightest_loop(r) for r in done]
  spill = f"{spread([r['spill_store_bytes'] for r in done])}/{spread([r['spill_load_bytes'] for r in done])}"
  failed = len(rows) - len(done)
  too_big = sum(not r["fits_smem"] for r in done)
  phase = {"forward": "fwd", "backward": "bwd"}.get(phase, phase)
  return (f"{peer:<16} {phase:<3} {kernel:<36} {config:<34} {spread([r['registers'] for r in done]):>7} "
          f"{spill:>9} {spread([r['smem_bytes'] / 1024 for r in done], '{:.1f}'):>11} "
          f"{spread([x[0] for x in loops if x]):>9} {spread([x[1] for x in loops if x]):>6}"
          + (f"  FAILED {failed}: {next(r['error'] for r in rows if not r['compiled'])}" if failed else "")
          + (f"  {too_big} over {H100_MAX_SMEM // 1024} KiB of shared memory: cannot launch" if too_big else ""))


def config_text(row):
  config = row.get("config")
  if not config:
    return "-"
  tiles = " ".join(f"{k}={v}" for k, v in config.items() if k not in ("num_warps", "num_stages"))
  return f"{tiles} w{config.get('num_warps', '?')} s{config.get('num_stages', '?')}".strip()


def print_table(rows, all_configs):
  """Fixed-config kernels one line each; an autotuned kernel one line over its configs (ranges)
  unless ``all_configs``."""
  print(f"{'peer':<16} {'':<3} {'kernel':<36} {'config':<34} {'regs':>7} {'spill B':>9} {'smem KiB':>11} "
        f"{'loop ins':>9} {'tensor':>6}")
  groups = {}
  for row in rows:
    key = (row["peer"], row["variant"], row["phase"], row["kernel"])
    if row.get("autotune_index") is None or all_configs:
      key += (len(groups),)
    groups.setdefault(key, []).append(row)
  for key, members in groups.items():
    peer, variant, phase, kernel = key[:4]
    label = peer if variant == "default" else f"{peer}/{variant}"
    autotuned = members[0].get("autotune_index") is not None
    config = (f"{len(members)} autotune configs" if autotuned and len(members) > 1
              else config_text(members[0]))
    print(table_line(label, phase, kernel, config, members))


# ----------------------------------------------------------------------------- main


def versions(official_path, commit):
  import triton
  import torch
  from lpcjax.aot.compiler_reports import Toolchain
  with open(official_path, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()
  return {"triton": triton.__version__, "fla": importlib.metadata.version("flash-linear-attention"),
          "torch": torch.__version__, "python": platform.python_version(), "ptxas": Toolchain.find().version(),
          "fox_official_commit": commit, "fox_official_file_sha256": digest}


def notes(rows):
  """What a reader of the JSON needs to know about where each config came from."""
  lists = sorted({(r["kernel"], r["autotune_list"]) for r in rows if r.get("autotune_index") is not None})
  return ["fox_official: block sizes, warps and stages from its get_fwd_config / get_bwd_kv_config / "
          "get_bwd_q_config for capability (9, 0); _bwd_preprocess is launched with Triton's defaults.",
          "fla: Triton path only (fla.ops.attn.parallel); its TileLang backend, which fla prefers on Hopper "
          "with triton >= 3.4 when tilelang is installed, is not compiled. Attention kernels: fixed configs "
          "from parallel_attn_fwd/bwd's check_shared_mem('hopper') branch.",
          *[f"fla {kernel}: autotune {how}; every config compiled (one row each), the autotuner picks one "
            "at run time on the GPU" for kernel, how in lists]]


def launch_rows(launch, toolchain):
  """The rows of one launch: one per candidate, or one failed row when its heuristics or autotune
  list cannot be evaluated."""
  try:
    found = list(candidates(launch))
  except Exception as error:
    message = (str(error).strip().splitlines() or [""])[0]
    name = getattr(launch.kernel, "__name__", type(launch.kernel).__name__)
    return [{"peer": launch.peer, "variant": launch.variant, "phase": launch.phase, "kernel": name, "choice": "-",
             "compiled": False, "error": f"configs: {type(error).__name__}: {message}"[:300]}]
  return [compile_row(candidate, toolchain) for candidate in found]


def capture(peer, variant, record):
  """(launches, rows): a peer whose launches cannot be recorded (import error, changed API) is one
  failed row, and the other peer still runs."""
  try:
    return record(), []
  except Exception as error:
    message = (str(error).strip().splitlines() or [""])[0]
    return [], [{"peer": peer, "variant": variant, "phase": "-", "kernel": "-", "choice": "-", "compiled": False,
                 "error": f"recording the launches: {type(error).__name__}: {message}"[:300]}]


def main():
  args = parse_args()
  os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
  from lpcjax.aot.compiler_reports import Toolchain
  from lpcjax.files import write_json_atomic
  toolchain = Toolchain.find()
  try:
    official_path = official_file(args.fox_official_src)
  except FileNotFoundError as error:
    sys.exit(f"error: {error}")
  official = lambda adaptive: official_launches(load_official(official_path), args, adaptive)
  peers = [("fox_official", "default", lambda: official(False))]
  peers += [("fox_official", "acp", lambda: official(True))] if args.fox_adaptive else []
  peers += [("fla", "default", lambda: fla_launches(args))]
  rows = []
  for peer, variant, record in peers:
    launches, failed = capture(peer, variant, record)
    rows += failed + [row for launch in launches for row in launch_rows(launch, toolchain)]
  found = versions(official_path, args.fox_official_commit)
  print(f"triton {found['triton']}, fla {found['fla']}, sm_90a, PTX {PTX_VERSION / 10}, T = {args.seq_len}, "
        f"D = {args.head_dim}, {args.heads} heads, batch {args.batch}, {args.dtype}, causal")
  print_table(rows, args.all_configs)
  for line in notes(rows):
    print("note:", line)
  command = shlex.join(["python", os.path.relpath(sys.argv[0])] + sys.argv[1:])
  write_json_atomic(args.out, {"date": datetime.date.today().isoformat(),
                               "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, no accelerator",
                               "versions": found, "command": command,
                               "target": {"arch": "sm_90a", "ptx_version": PTX_VERSION, "device": "H100"},
                               "shape": {"batch": args.batch, "seq_len": args.seq_len, "heads": args.heads,
                                         "head_dim": args.head_dim, "dtype": args.dtype, "causal": True},
                               "notes": notes(rows), "rows": rows})
  print(f"wrote {args.out}")
  sys.exit(0 if all(row["compiled"] for row in rows) else 1)


if __name__ == "__main__":
  main()

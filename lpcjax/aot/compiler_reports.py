"""What the compilers say about each kernel of a compiled program: registers, spills, shared
memory or VMEM, barriers, threads, and the instruction mix of its tensor-core loops.

Three GPU compilers build lpcjax's kernels, each with its own dump:

* XLA (Pallas on Triton, ``impl="pallas"``): ``xla_dump_to`` with the emitter filter "ptx"
  writes the PTX of every kernel of the program; the Pallas kernels among them are the compiled
  HLO's Triton custom calls. Their shared memory is only in XLA's Triton-to-LLVM dump
  (``xla_triton_smem``), which costs: about 200 MB and half a minute per compile, and every
  later compile in the same process runs several times slower (seen with jax 0.11.2), so a
  benchmark asks for it once per process;
* Mosaic GPU (``impl="mosaic_gpu"``): ``MOSAIC_GPU_DUMP_TO`` writes each kernel's PTX, ptxas
  report and resources (shared memory, barriers);
* jax-triton (``impl="triton"``): the kernels are PTX in the program, assembled when the GPU
  loads them; ``JAX_TRITON_DUMP_DIR`` writes the PTX and the shared memory of the launch.

Every GPU row is then measured the same way here: the kernel's PTX through one ptxas
(``Toolchain``: registers and spill bytes from ``ptxas -v``; this is also the check that the
PTX assembles for sm_90a) and its machine code through nvdisasm, whose loops that hold
tensor-core instructions are counted by instruction class. These are the compiler's counts:
they say what a kernel costs in registers and instructions, not how fast it runs.

TPU kernels (libtpu's Mosaic) report the VMEM each kernel reserves in the compiled program
(``used_scoped_memory_configs`` of its ``tpu_custom_call``).
"""

import contextlib
import dataclasses
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Optional


@dataclasses.dataclass
class KernelReport:
  """One compiled kernel: ``name`` (the kernel's own: the pallas_call's or Mosaic GPU body's),
  ``compiler`` ("xla-triton", "mosaic-gpu", "jax-triton", "mosaic-tpu"); GPU: registers, spill
  bytes, shared memory, barriers (and Mosaic GPU's mbarriers), threads per block, ``loops`` (the
  instruction mix of each loop that holds tensor-core instructions, ``sass_mix``),
  ``ptxas_warnings`` (ptxas's warnings about it, e.g. wgmma serialized; empty: none); TPU:
  ``vmem_bytes``."""

  name: str
  compiler: str
  registers: Optional[int] = None
  spill_store_bytes: Optional[int] = None
  spill_load_bytes: Optional[int] = None
  smem_bytes: Optional[int] = None
  barriers: Optional[int] = None  # named barriers (bar.sync ids), as ptxas counts them
  mbarriers: Optional[int] = None  # Mosaic GPU's shared-memory mbarriers
  threads: Optional[int] = None
  loops: Optional[list] = None
  ptxas_warnings: Optional[list] = None
  vmem_bytes: Optional[int] = None

  def as_dict(self):
    return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


# ----------------------------------------------------------------------------- the tools


def _package_tool(module, *parts):
  """The path of a tool shipped inside an installed Python package, or None."""
  try:
    spec = __import__("importlib.util").util.find_spec(module)
  except (ImportError, ValueError):
    return None
  if spec is None or not spec.submodule_search_locations:
    return None
  path = os.path.join(list(spec.submodule_search_locations)[0], *parts)
  return path if os.access(path, os.X_OK) else None


@dataclasses.dataclass(frozen=True)
class Toolchain:
  """The ptxas every GPU kernel is assembled with, and the nvdisasm that reads the result."""

  ptxas: Optional[str]
  nvdisasm: Optional[str]

  @classmethod
  def find(cls):
    """ptxas of the pip package nvidia-cuda-nvcc-cu12 (the one the [aot] extra pins, and the one
    ``jax[cuda12]`` installs on a GPU machine), else triton's, else the first on PATH; nvdisasm
    from triton's wheel, else PATH."""
    ptxas = (_package_tool("nvidia.cuda_nvcc", "bin", "ptxas")
             or _package_tool("triton", "backends", "nvidia", "bin", "ptxas") or shutil.which("ptxas"))
    nvdisasm = _package_tool("triton", "backends", "nvidia", "bin", "nvdisasm") or shutil.which("nvdisasm")
    return cls(ptxas, nvdisasm)

  def version(self):
    """ptxas's "V12.9.86", or None."""
    if self.ptxas is None:
      return None
    found = re.search(r"V\d+\.\d+\.\d+", subprocess.run([self.ptxas, "--version"], capture_output=True,
                                                       text=True, check=False).stdout)
    return found.group(0) if found else None

  def use_for_compiles(self):
    """Put this ptxas first on PATH for the rest of the process: XLA's compiles for an absent GPU
    and Mosaic GPU's look for ptxas there, and Mosaic GPU picks the PTX version it writes from
    the ptxas it finds first. Without this the result depends on whatever CUDA a machine has."""
    if self.ptxas is not None:
      folder = os.path.dirname(self.ptxas)
      if os.environ.get("PATH", "").split(os.pathsep)[0] != folder:
        os.environ["PATH"] = folder + os.pathsep + os.environ.get("PATH", "")

  def assemble(self, ptx, entry, arch="sm_90a"):
    """(ptxas -v's resources, SASS text or None) of kernel ``entry`` of a PTX module (which may
    hold others); a RuntimeError carrying ptxas's message when the module does not assemble."""
    if self.ptxas is None:
      raise RuntimeError("no ptxas found: pip install nvidia-cuda-nvcc-cu12 (the [aot] extra)")
    with tempfile.TemporaryDirectory() as folder:
      source, cubin = os.path.join(folder, "kernel.ptx"), os.path.join(folder, "kernel.cubin")
      with open(source, "w") as f:
        f.write(ptx)
      run = subprocess.run([self.ptxas, f"-arch={arch}", "-v", source, "-o", cubin], capture_output=True,
                           text=True, check=False)
      if run.returncode:
        message = [line for line in run.stderr.splitlines() if "error" in line or "fatal" in line]
        raise RuntimeError(f"ptxas: {(message or run.stderr.splitlines() or ['failed'])[0].strip()}")
      sass = None
      if self.nvdisasm is not None:
        sass = subprocess.run([self.nvdisasm, "-c", cubin], capture_output=True, text=True, check=False).stdout
        sections = re.split(r"^\s*//-+ \.text\.", sass, flags=re.M)  # one per function
        sass = next((s for s in sections if s.startswith(entry)), sass)
    # ptxas -v: "Compiling entry function 'NAME'", then its properties up to the next function
    block = run.stderr.split(f"Compiling entry function '{entry}'")[-1].split("Compiling entry function")[0]
    number = lambda pattern: int(re.search(pattern, block).group(1))
    barriers = re.search(r"used (\d+) barriers", block)
    resources = {"registers": number(r"Used (\d+) registers"),
                 "spill_store_bytes": number(r"(\d+) bytes spill stores"),
                 "spill_load_bytes": number(r"(\d+) bytes spill loads"),
                 "barriers": int(barriers.group(1)) if barriers else 0,
                 "ptxas_warnings": ptxas_warnings(run.stderr, entry)}
    return resources, sass


def ptxas_warnings(stderr, entry):
  """ptxas's warnings about kernel ``entry``: those naming it, or naming no function (ptxas names
  the function of a per-function one, e.g. "wgmma.mma_async instructions are serialized due to
  ... in the function 'NAME'")."""
  return [line.strip() for line in stderr.splitlines()
          if "warning" in line and (f"'{entry}'" in line or "function '" not in line)]


# ----------------------------------------------------------------------------- SASS


_CLASSES = (  # (class, opcode prefixes), first match wins
    ("tensor", ("HGMMA", "HMMA", "IMMA", "QGMMA", "UTCMMA")),
    ("mufu", ("MUFU",)),
    ("fp32", ("FADD", "FMUL", "FFMA", "FMNMX", "FSEL", "FSETP", "FSET", "FCHK", "FRND", "FSWZADD")),
    ("convert", ("F2F", "F2I", "I2F", "F2FP", "I2FP")),
    ("spill", ("LDL", "STL")),
    ("load_store", ("LDG", "STG", "LDS", "STS", "LDSM", "STSM", "LD.", "ST.", "LDC", "ULDC", "UTMA", "UBLKCP",
                    "ATOM", "RED", "UTMAPF", "LDGSTS", "LDGDEPBAR")),
    ("sync", ("BAR", "SYNCS", "WARPSYNC", "MEMBAR", "DEPBAR", "WARPGROUP", "FENCE", "ERRBAR", "ARRIVES", "CCTL")),
    ("control", ("BRA", "EXIT", "BSSY", "BSYNC", "CALL", "RET", "NOP", "YIELD", "JMP", "BMOV")),
)
_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
_BRANCH = re.compile(r"/\*([0-9a-f]{4,})\*/.*\bBRA\b.*`\((\.L_x_\d+)\)")
_GMMA_SHAPE = re.compile(r"GMMA\.(\d+)x(\d+)x(\d+)")
# a predicated instruction (@P0 ..., @!UP1 ...) or a branch on an operand: a predicate (BRA P2, ...,
# BRA.U !UP0, ...) or a register (BRA.DIV UR4, ..., a warp's divergence test)
_CONDITIONAL = re.compile(r"/\*[0-9a-f]{4,}\*/\s+@|\bBRA(?:\.\w+)*\s+(?:!?U?P\w*|~?U?R\w+)\s*,")
UNIT = 64 * 64 * 128  # one matmul "unit": a 64 x 64 x 128 product (the cost model of docs/kernels_mosaic_gpu.md)


def _class_of(opcode):
  for name, prefixes in _CLASSES:
    if opcode.startswith(prefixes):
      return name
  return "integer_other"


def _reaches(instructions, index, start, end):
  """Whether the instruction at address ``end`` is reached from the one at ``start`` without
  leaving [start, end]: falling through (not past an unconditional branch or exit) or branching
  to a target inside it. ``index`` maps addresses to positions in ``instructions``."""
  seen, todo = set(), [index[start]]
  while todo:
    i = todo.pop()
    if i in seen or i >= len(instructions) or instructions[i][0] > end:
      continue
    seen.add(i)
    address, op, _, target, conditional = instructions[i]
    if address == end:
      return True
    if target is not None and start <= target <= end:
      todo.append(index[target])
    if conditional or not op.startswith(("BRA", "EXIT", "RET", "JMP")):
      todo.append(i + 1)
  return False


def sass_mix(sass):
  """The instruction mix of each innermost loop of ``sass`` (nvdisasm -c output) that holds
  tensor-core instructions: a list of {class: count, "total": n, "units": u}, in address order,
  ``units`` the warpgroup matmuls (HGMMA) of one trip in 64 x 64 x 128 units. A loop is a
  backward branch's range that its start reaches its branch through (``_reaches``): ptxas puts
  an mbarrier wait's retry after the kernel's exit, from where it jumps back into the loop, and
  that range, the rest of the loop plus everything after it, is no loop. One holding another
  loop is left out (the inner one is the per-tile work)."""
  instructions, labels, loops = [], {}, []
  pending = []
  for line in sass.splitlines():
    label = re.match(r"^(\.L_x_\d+):", line.strip())
    if label:
      pending.append(label.group(1))
      continue
    found = _INSTRUCTION.search(line)
    if not found:
      continue
    address = int(found.group(1), 16)
    for name in pending:
      labels[name] = address
    pending = []
    shape = _GMMA_SHAPE.search(line)
    units = int(shape[1]) * int(shape[2]) * int(shape[3]) / UNIT if shape else 0.0
    branch = _BRANCH.search(line)
    conditional = bool(_CONDITIONAL.search(line))
    instructions.append([address, found.group(2), units, branch.group(2) if branch else None, conditional])
    if branch:
      loops.append((branch.group(2), address))
  for instruction in instructions:  # labels to addresses
    instruction[3] = labels.get(instruction[3])
  index = {instruction[0]: i for i, instruction in enumerate(instructions)}
  ranges = sorted({(labels[target], end) for target, end in loops if target in labels and labels[target] <= end})
  ranges = [(start, end) for start, end in ranges if _reaches(instructions, index, start, end)]
  mixes = []
  for start, end in ranges:
    inside = [(op, units) for address, op, units, _, _ in instructions if start <= address <= end]
    if not any(_class_of(op) == "tensor" for op, _ in inside):
      continue
    mixes.append(((start, end), inside))
  innermost = [(span, ops) for span, ops in mixes
               if not any(other != span and span[0] <= other[0] and other[1] <= span[1] for other, _ in mixes)]
  result = []
  for _, inside in innermost:
    counts = {"total": len(inside), "units": sum(units for _, units in inside)}
    for op, _ in inside:
      counts[_class_of(op)] = counts.get(_class_of(op), 0) + 1
    result.append(counts)
  return result


def _threads(ptx):
  found = re.search(r"\.(?:reqntid|maxntid)\s+(\d+)(?:,\s*(\d+))?(?:,\s*(\d+))?", ptx)
  if not found:
    return None
  total = 1
  for part in found.groups():
    total *= int(part or 1)
  return total


def _gpu_report(name, compiler, ptx, toolchain, **known):
  entry = re.search(rf"\.entry ({re.escape(name)}\w*)\(", ptx) or re.search(r"\.entry (\w+)\(", ptx)
  resources, sass = toolchain.assemble(ptx, entry.group(1))
  report = KernelReport(name, compiler, threads=_threads(ptx), **resources, **known)
  if sass:
    report.loops = sass_mix(sass)
  return report


# ----------------------------------------------------------------------------- the dumps


class GpuDumps:
  """Folders the three GPU compilers dump into during one compile (a context manager: enter it
  before lowering, Mosaic GPU writes its resources then), and their kernels afterwards
  (``reports``). ``compiler_options`` go to ``Lowered.compile``."""

  def __init__(self, toolchain=None, xla_triton_smem=False):
    self.toolchain = toolchain or Toolchain.find()
    self.xla_triton_smem = xla_triton_smem
    self._stack = contextlib.ExitStack()

  def __enter__(self):
    self.root = self._stack.enter_context(tempfile.TemporaryDirectory(prefix="lpcjax-aot-"))
    self.xla, self.mosaic, self.triton = (os.path.join(self.root, name) for name in ("xla", "mosaic", "triton"))
    for folder in (self.xla, self.mosaic, self.triton):
      os.makedirs(folder)
    self._stack.enter_context(_environment("MOSAIC_GPU_DUMP_TO", self.mosaic))
    self._stack.enter_context(_jax_triton_dumps(self.triton))
    return self

  def __exit__(self, *exc):
    return self._stack.__exit__(*exc)

  @property
  def compiler_options(self):
    return {"xla_dump_to": self.xla, "xla_dump_emitter_re": "ptx|triton-to-llvm" if self.xla_triton_smem else "ptx"}

  def reports(self, compiled_text):
    """A KernelReport per kernel of the three compilers (XLA's own fusions left out), by name;
    ``compiled_text``: the compiled program's HLO (``Compiled.as_text()``)."""
    return self._xla_triton(compiled_text) + self._mosaic() + self._jax_triton()

  def _xla_triton(self, compiled_text):
    reports = []
    ptx_files = [_read(path) for path in glob.glob(os.path.join(self.xla, "*.ptx"))]
    for name in sorted(set(pallas_call_names(compiled_text, '"__gpu$xla.gpu.triton"'))):
      ptx = next((text for text in ptx_files if re.search(rf"\.entry {re.escape(name)}\(", text)), None)
      if ptx is None:
        continue
      smem = None
      for module in glob.glob(os.path.join(self.xla, f"*.{name}.triton-to-llvm.txt")):
        found = re.search(r"ttg\.shared = (\d+)", _read(module))
        smem = int(found.group(1)) if found else None
      reports.append(_gpu_report(name, "xla-triton", ptx, self.toolchain, smem_bytes=smem))
    return reports

  def _mosaic(self):
    reports = []
    for ptx_file in sorted(glob.glob(os.path.join(self.mosaic, "*.ptx"))):
      base = ptx_file[:-len(".ptx")]
      name = re.sub(r"_\d+$", "", os.path.basename(base))
      resources = _read(base + ".resources.txt") if os.path.exists(base + ".resources.txt") else ""
      smem = re.search(r"smem_scratch_bytes=(\d+)", resources)
      mbarriers = sum(int(n) * int(count) for n, count in re.findall(r"num_barriers=(\d+)[^)]*\): (\d+)", resources))
      reports.append(_gpu_report(name, "mosaic-gpu", _read(ptx_file), self.toolchain,
                                 smem_bytes=int(smem.group(1)) if smem else None, mbarriers=mbarriers))
    return reports

  def _jax_triton(self):
    reports = []
    for info in sorted(glob.glob(os.path.join(self.triton, "*", "*.compile_info"))):
      name = os.path.basename(info)[:-len(".compile_info")]
      smem = re.search(r"shared_mem_bytes:\s*(\d+)", _read(info))
      reports.append(_gpu_report(name, "jax-triton", _read(info[:-len(".compile_info")] + ".ptx"), self.toolchain,
                                 smem_bytes=int(smem.group(1)) if smem else None))
    return reports


def _read(path):
  with open(path) as f:
    return f.read()


@contextlib.contextmanager
def _environment(name, value):
  old = os.environ.get(name)
  os.environ[name] = value
  try:
    yield
  finally:
    if old is None:
      os.environ.pop(name, None)
    else:
      os.environ[name] = old


@contextlib.contextmanager
def _jax_triton_dumps(folder):
  """jax-triton (0.4) writes a kernel's PTX where its module-level JAX_TRITON_DUMP_DIR says,
  read once at import, and only when it compiles the kernel: a kernel it compiled before in this
  process comes from its per-kernel cache. So the folder is set on the module, and the caches
  of lpcjax's own Triton kernels are emptied first (a cache miss costs a Triton compile)."""
  try:
    from jax_triton import triton_lib
  except ImportError:
    yield
    return
  kernels = sys.modules.get("lpcjax.kernels.triton_kernels")  # not imported yet: no cache to clear
  for kernel in vars(kernels).values() if kernels else ():
    cache = getattr(kernel, "_jT_kernel_cache", None)
    if isinstance(cache, dict):
      cache.clear()
  old = getattr(triton_lib, "_JAX_TRITON_DUMP_DIR", None)
  triton_lib._JAX_TRITON_DUMP_DIR = folder
  try:
    yield
  finally:
    triton_lib._JAX_TRITON_DUMP_DIR = old


# ----------------------------------------------------------------------------- TPU


def _custom_calls(compiled_text, target):
  """(kernel name, HLO line) of each custom call to ``target`` in a compiled program's HLO text:
  the name is the pallas_call's own, the innermost of its op_name ("jvp(NAME)/pallas_call")."""
  for line in compiled_text.splitlines():
    if f"custom_call_target={target}" in line:
      name = re.search(r'op_name="[^"]*?([\w.]+)\)*/pallas_call"', line)
      yield (name.group(1) if name else target.strip('"')), line


def pallas_call_names(compiled_text, target):
  return [name for name, _ in _custom_calls(compiled_text, target)]


def tpu_reports(compiled_text):
  """A KernelReport per Mosaic TPU kernel of a compiled program's HLO text (``Compiled.as_text()``):
  its name (the pallas_call's) and the VMEM it reserves."""
  reports = []
  for name, line in _custom_calls(compiled_text, '"tpu_custom_call"'):
    used = re.search(r'"used_scoped_memory_configs":(\[[^\]]*\])', line)
    vmem = sum(int(entry["size"]) for entry in json.loads(used.group(1))) if used else 0
    reports.append(KernelReport(name, "mosaic-tpu", vmem_bytes=vmem))
  return reports

"""Plan a run on chips that are not here: ``train.py --compile-for TARGET``.

The training step of a config (its mesh, sharding rules, rematerialisation, optimizer and
attention backend, as a real run builds them) is compiled for the target's compile-only devices
(``lpcjax.aot.targets``) and read back: per device, the parameters and optimizer state, the
step's temporaries, the total against the chip's memory; the step's FLOPs (the family's model
FLOPs beside the compiler's count); the collectives in the compiled program; on TPU XLA's time
estimate. Nothing runs and nothing is written to a run directory.

What the figures are: XLA's memory analysis of the compiled step (arguments + outputs +
temporaries - aliased, the per-device peak XLA plans for; the runtime's own reserve and
fragmentation are not in it, so a margin under ~10 % is tight). The collectives are counted per
occurrence in the compiled program: one inside the scanned layer loop runs once per layer; its
bytes are the largest array the op produces. The TPU time estimate is XLA's cost model, not a
measurement.

A config that does not fit gets the overrides that bring it under, found by compiling the
candidates (more FSDP, full rematerialisation, gradient accumulation, context parallelism,
tensor parallelism), in that order, cheapest first, not guessed.
"""

import dataclasses
import re
import time

import jax
import numpy as np

from lpcjax import experiment, models
from lpcjax.config import ConfigError
from lpcjax.files import write_json_atomic
from lpcjax.kernels import platform_problem
from lpcjax.kernels.target import building_for

from .targets import GiB, compile_only_devices, parse_target
from .train_step import compile_lowered, lowered_train_step

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")
_COLLECTIVE = re.compile(r"=\s*(.+?)\s+(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")
_ARRAY = re.compile(r"\b(pred|[suf]\d+|bf16|f8e\w+)\[([\d,]*)\]")
_DTYPE_BYTES = {"pred": 1, "bf16": 2}
# libtpu's refusal of a step over the chip's memory ("G": GiB, as XLA prints sizes)
_OUT_OF_MEMORY = re.compile(r"memory required for HLO temporaries \(([\d.]+)G\) exceeds available HBM \(([\d.]+)G\)")


def _array_bytes(dtype, dims):
  """Bytes of an HLO array type: f32[1024,768] is 4 x 1024 x 768."""
  size = _DTYPE_BYTES.get(dtype) or (1 if dtype.startswith("f8") else int(dtype[1:]) // 8)
  return size * int(np.prod([int(d) for d in dims.split(",") if d]))


def collectives(hlo_text):
  """{kind: {"count", "bytes"}} of the collectives in compiled HLO text (see the module's note)."""
  found = {}
  for match in _COLLECTIVE.finditer(hlo_text):
    arrays = [_array_bytes(dtype, dims) for dtype, dims in _ARRAY.findall(match[1])]
    entry = found.setdefault(match[2], {"count": 0, "bytes": 0})
    entry["count"] += 1
    entry["bytes"] += max(arrays, default=0)
  return found


def _shard_bytes(structs):
  """Bytes one device holds of ShapeDtypeStructs with shardings (the first device's shard)."""
  return int(sum(np.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(structs)))


@dataclasses.dataclass
class StepPlan:
  """What a compile of one config for one target says; ``fits`` against the chip's memory."""

  target: str
  devices: int
  chip_memory: int
  mesh: dict
  overrides: tuple
  params: int
  optimizer_state: int
  batch: int
  arguments: int
  outputs: int
  temporaries: int
  aliased: int
  code: int
  model_flops: float
  compiler_flops: float
  estimated_seconds: float
  collectives: dict
  refused: str = ""  # the compiler's own out-of-memory refusal (TPU): then total and memory are its figures

  @property
  def total(self):
    if self.refused:
      return self.temporaries
    return self.arguments + self.outputs + self.temporaries - self.aliased + self.code

  @property
  def fits(self):
    return self.total <= self.chip_memory

  def mesh_text(self):
    return "mesh " + " x ".join(f"{axis} {size}" for axis, size in self.mesh.items())

  def to_json(self):
    return {**dataclasses.asdict(self), "total": self.total, "fits": self.fits,
            "margin": self.chip_memory - self.total}

  def lines(self):
    gib = lambda n: f"{n / GiB:.2f} GiB" if abs(n) >= GiB else f"{n / 2**20:.1f} MiB"
    margin = self.chip_memory - self.total
    if self.refused:
      return [f"target   {self.target}: {self.devices} devices; {self.mesh_text()}",
              f"state    parameters {gib(self.params)}, optimizer state {gib(self.optimizer_state)} per device",
              f"total    does not fit: the compiler refused the step, {gib(self.total)} against the "
              f"{gib(self.chip_memory)} it can use per device ({self.refused})"]
    lines = [
        f"target   {self.target}: {self.devices} devices; {self.mesh_text()}",
        f"state    parameters {gib(self.params)}, optimizer state {gib(self.optimizer_state)} per device "
        f"(batch {gib(self.batch)})",
        f"step     temporaries {gib(self.temporaries)}, outputs {gib(self.outputs)} (aliased with the state: "
        f"{gib(self.aliased)}), code {self.code / 2**20:.1f} MiB",
        f"total    {gib(self.total)} of {gib(self.chip_memory)} per device: "
        + (f"fits, {gib(margin)} to spare ({margin / self.chip_memory:.0%})" if self.fits
           else f"does not fit, {gib(-margin)} over"),
        "flops    " + (f"model {self.model_flops:.3g} per step" if self.model_flops else "model: the family gives none")
        + (f"; the compiler's count {self.compiler_flops:.3g} per device (a loop's body, such as the scanned "
           "layers, counted once)" if self.compiler_flops else ""),
        "comms    " + ("; ".join(f"{kind} x{entry['count']} ({gib(entry['bytes'])})"
                                 for kind, entry in sorted(self.collectives.items())) or "none")
        + " (per occurrence in the compiled program; inside the layer loop, once per layer)",
    ]
    if self.estimated_seconds > 0:  # libtpu gives a negative figure where it has none (a slice of 2 hosts)
      lines.append(f"estimate {self.estimated_seconds * 1e3:.1f} ms per step (XLA's cost model, an estimate, not a "
                   "measurement; a loop's body counted once)")
    return lines


def plan_step(config, target, overrides=()):
  """A StepPlan of ``config`` (an ExperimentConfig) with ``overrides`` compiled for ``target``
  (a name or Target). Errors as a real run gives them: a mesh the target cannot hold and a
  backend its chip does not run are one-line ConfigErrors."""
  target = parse_target(target) if isinstance(target, str) else target
  config = experiment.apply_overrides(config, list(overrides))
  devices = compile_only_devices(target)
  impl = getattr(config.model, "attention_impl", None)
  with building_for(devices[0]):
    problem = impl and platform_problem(impl)
  if problem:
    there = problem.replace("this machine", f"target {target.name}").replace("run here", "run there")
    raise ConfigError(f"model.attention_impl: {there}")
  lowered, state, batch, family, mesh = lowered_train_step(config, devices)
  fixed = dict(target=target.name, devices=target.num_devices, mesh=dict(mesh.shape), overrides=tuple(overrides),
               params=_shard_bytes(state.params), optimizer_state=_shard_bytes(state.opt_state),
               batch=_shard_bytes(batch))
  try:
    compiled = compile_lowered(lowered)
  except jax.errors.JaxRuntimeError as error:  # libtpu refuses a program over the chip's memory
    refused = refused_plan(fixed, str(error))
    if refused is None:
      raise
    return refused
  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
  units = config.data.batch_size * family.units_per_example(config)
  model_flops = family.flops_per_unit(config, state.params) * units if family.flops_per_unit else 0.0
  return StepPlan(
      **fixed, chip_memory=target.memory_bytes, arguments=memory.argument_size_in_bytes,
      outputs=memory.output_size_in_bytes,
      temporaries=memory.temp_size_in_bytes, aliased=memory.alias_size_in_bytes,
      code=memory.generated_code_size_in_bytes, model_flops=float(model_flops),
      compiler_flops=float(cost.get("flops", 0.0)), estimated_seconds=float(cost.get("optimal_seconds", 0.0)),
      collectives=collectives(compiled.as_text()))


def refused_plan(fixed, message):
  """The StepPlan of a step the compiler refused for its memory (libtpu's ``message``: the
  memory it needed and the memory it can use, which become the plan's figures), with the
  ``fixed`` fields (target, devices, mesh, overrides, state sizes); None for another error."""
  over = _OUT_OF_MEMORY.search(message)
  if not over:
    return None
  return StepPlan(**fixed, chip_memory=int(float(over[2]) * GiB), arguments=0, outputs=0,
                  temporaries=int(float(over[1]) * GiB), aliased=0, code=0, model_flops=0.0, compiler_flops=0.0,
                  estimated_seconds=0.0, collectives={}, refused=over[0])


def candidates(config, target):
  """Override sets that lower a step's memory, cheapest first, each built on the one before
  where that helps: all devices for FSDP, full rematerialisation, gradient accumulation of 2 and
  4 micro-batches, the sequence over 2 and 4 devices (families that can split it), tensor
  parallelism over 2."""
  train, model, devices = config.train, config.model, parse_target(target).num_devices
  fsdp = [] if train.mesh_fsdp == devices else [f"train.mesh_fsdp={devices}", "train.mesh_data=1",
                                                  "train.mesh_context=1", "train.mesh_tensor=1"]
  remat = [] if getattr(model, "remat_policy", "full") == "full" else ["model.remat_policy=full"]
  sets = [fsdp, fsdp + remat]
  for accum in (2, 4):
    if config.data.batch_size % (accum * train.grad_accum_steps) == 0:
      sets.append(fsdp + remat + [f"train.grad_accum_steps={accum * train.grad_accum_steps}"])
  if models.get(model.family).context_parallel:
    for ways in (2, 4):
      if devices % ways == 0:
        sets.append(remat + [f"train.mesh_fsdp={devices // ways}", "train.mesh_data=1", f"train.mesh_context={ways}",
                             "train.mesh_tensor=1"])
  if devices % 2 == 0:
    sets.append(remat + [f"train.mesh_fsdp={devices // 2}", "train.mesh_data=1", "train.mesh_context=1",
                         "train.mesh_tensor=2"])
  unique = []
  for overrides in sets:
    if overrides and overrides not in unique:
      unique.append(overrides)
  return unique


def fitting_overrides(config, target, most=2):
  """[(overrides, StepPlan)] of the candidates that compile and fit, up to ``most``; the ones
  that fail to compile for this config (a mesh its shapes do not divide) are passed over."""
  found = []
  for overrides in candidates(config, target):
    try:
      plan = plan_step(config, target, overrides)
    except ConfigError:
      continue
    if plan.fits:
      found.append((overrides, plan))
      if len(found) == most:
        break
  return found


def compile_for(config, target, json_path=None, print_line=print):
  """``train.py --compile-for``: the plan's block, then for a step that does not fit one line
  with the compiled overrides that fit. Returns 0 (fits) or 1 (does not); ``json_path``: the
  same as JSON, with the whole config as compiled and the command's wall time."""
  start = time.perf_counter()
  plan = plan_step(config, target)
  for line in plan.lines():
    print_line(line)
  report = {"plan": plan.to_json(), "fitting_overrides": []}
  status = 0
  if not plan.fits:
    status = 1
    found = fitting_overrides(config, target)
    report["fitting_overrides"] = [{"overrides": list(overrides), **fit.to_json()} for overrides, fit in found]
    if found:
      print_line(f"does not fit: {(plan.total - plan.chip_memory) / GiB:.2f} GiB over; compiled and fitting: "
                 + "; or ".join(f"{' '.join(overrides)} ({fit.total / GiB:.2f} GiB, {fit.mesh_text()})"
                                for overrides, fit in found))
    else:
      print_line(f"does not fit: {(plan.total - plan.chip_memory) / GiB:.2f} GiB over, and none of "
                 f"{len(candidates(config, target))} compiled candidates (FSDP, rematerialisation, accumulation, "
                 "context and tensor parallelism) fits: a larger target, or a smaller batch or model")
  if json_path:
    write_json_atomic(json_path, {**report, "config": experiment.to_dict(config),
                                  "seconds": round(time.perf_counter() - start, 1)})
  return status


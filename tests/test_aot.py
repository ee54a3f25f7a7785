"""lpcjax.aot's parts that need no compiler: target names, the GPU target config, the readers of
ptxas's and nvdisasm's output and of a compiled TPU program, the PTX ISA a ptxas takes, the ptxas
guard of impl="mosaic_gpu", and the one-line error where the compilers are missing. The compiles
themselves: tests/kernels/test_compile_for_chips.py (CI's Python 3.12 leg)."""

import importlib.util

import jax.numpy as jnp
import numpy as np
import pytest

from lpcjax.aot import TargetError, compile_only_devices, parse_target
from lpcjax.aot.compiler_reports import ptxas_warnings, sass_mix, tpu_reports
from lpcjax.aot.targets import GPU_CHIPS, gpu_target_config
from lpcjax.kernels import block_sizes, mosaic_gpu, target


@pytest.mark.parametrize("name, kind, chip, processes, per_process", [
    ("h100", "gpu", "h100", 1, 1), ("H200x8", "gpu", "h200", 1, 8), ("2xh100x8", "gpu", "h100", 2, 8),
    ("v5e", "tpu", "v5e", 1, 1), ("v5e-16", "tpu", "v5e", 2, 8), ("v5p-8", "tpu", "v5p", 2, 4),
])
def test_target_names(name, kind, chip, processes, per_process):
  found = parse_target(name)
  assert (found.kind, found.chip, found.processes, found.devices_per_process) == (kind, chip, processes, per_process)


@pytest.mark.parametrize("name, message", [("a100", "unknown target 'a100'"), ("v5e-3", "v5e slices of")])
def test_an_unknown_target_is_one_line(name, message):
  with pytest.raises(TargetError, match=message) as error:
    parse_target(name)
  assert "\n" not in str(error.value)


def test_the_h100_target_config_says_sm_90a_and_the_data_sheet():
  text = gpu_target_config(GPU_CHIPS["h100"])
  for field in ("major: 9", "minor: 0", "feature_extension: ACCELERATED_FEATURES", "core_count: 132",
                f"shared_memory_per_block_optin: {227 * 1024}", 'platform_name: "CUDA"'):
    assert field in text
  assert text.count("{") == text.count("}")


def installed(module):
  try:
    return importlib.util.find_spec(module) is not None
  except ImportError:  # its parent package is missing
    return False


@pytest.mark.skipif(installed("jax_plugins.xla_cuda12"), reason="the compiler is here")
def test_without_the_gpu_compiler_the_error_says_what_to_install():
  with pytest.raises(TargetError, match=r"target h100: no GPU compiler here .*lpcjax\[aot\]") as error:
    compile_only_devices("h100")
  assert "\n" not in str(error.value)


SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ ;
        /*0020*/                   MUFU.EX2 R3, R2 ;
        /*0030*/                   FFMA R4, R3, R5, R6 ;
        /*0040*/                   STL [R1], R4 ;
        /*0050*/               @P0 BRA `(.L_x_1) ;
.L_x_2:
        /*0060*/                   SYNCS.PHASECHK.TRANS64 P0, [UR4], R0 ;
        /*0070*/              @!P0 BRA `(.L_x_2) ;
        /*0080*/                   EXIT ;
"""


def test_the_instruction_mix_counts_the_tensor_core_loop_only():
  """The spin-wait loop (no tensor-core instruction) is left out; the other is counted by class,
  and its matmul in 64 x 64 x 128 units (one 64 x 64 x 16 HGMMA: 1/8)."""
  assert sass_mix(SASS) == [{"total": 5, "units": 0.125, "tensor": 1, "mufu": 1, "fp32": 1, "spill": 1,
                             "control": 1}]


RETRY_SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R0 ;
        /*0020*/              @!P0 BRA `(.L_x_3) ;
.L_x_2:
        /*0030*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ ;
        /*0040*/                   MUFU.EX2 R3, R2 ;
        /*0050*/               @P1 BRA `(.L_x_1) ;
        /*0060*/                   FADD R4, R3, R5 ;
        /*0070*/                   EXIT ;
.L_x_3:
        /*0080*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R0 ;
        /*0090*/              @!P0 BRA `(.L_x_3) ;
        /*00a0*/                   BRA `(.L_x_2) ;
"""


def test_a_wait_retried_after_the_exit_is_no_loop():
  """ptxas puts an mbarrier wait's retry after the exit, from where it jumps back into the loop:
  that backward branch's range (the loop's rest, the exit, the retry) is not a loop, so the tile
  loop alone is counted (before, that range was counted as a second, heavier loop)."""
  assert sass_mix(RETRY_SASS) == [{"total": 5, "units": 0.125, "sync": 1, "control": 2, "tensor": 1, "mufu": 1}]


@pytest.mark.parametrize("exit_branch", ["@P0 BRA", "@!UP0 BRA", "BRA P2,", "BRA.U !UP0,", "BRA.DIV UR4,",
                                         "BRA.DIV ~URZ,"])
def test_a_loop_with_a_conditional_exit_is_still_a_loop(exit_branch):
  """A conditional branch out of the loop, in each of SASS's forms (a guard, a predicate operand,
  a uniform predicate, a divergence test on a register), falls through into the loop's rest: the
  loop is counted."""
  sass = f"""
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ ;
        /*0020*/                   {exit_branch} `(.L_x_2) ;
        /*0030*/                   MUFU.EX2 R3, R2 ;
        /*0040*/               @P1 BRA `(.L_x_1) ;
.L_x_2:
        /*0050*/                   EXIT ;
"""
  assert [loop["total"] for loop in sass_mix(sass)] == [4]


def test_a_kernels_ptxas_warnings_are_its_own():
  stderr = ("ptxas info    : Compiling entry function 'dq_kernel' for 'sm_90a'\n"
            "ptxas /tmp/k.ptx, line 9; warning : Potential Performance Loss: wgmma.mma_async instructions are "
            "serialized due to the presence of Extern calls in the function 'dq_kernel'.\n"
            "ptxas /tmp/k.ptx, line 99; warning : Potential Performance Loss: wgmma.mma_async instructions are "
            "serialized due to insufficient register resources for the wgmma pipeline in the function 'fwd'.\n"
            "ptxas warning : Unresolved extern function\n")
  found = ptxas_warnings(stderr, "dq_kernel")  # its own and the module's, not fwd's
  assert len(found) == 2 and "'dq_kernel'" in found[0] and found[1] == "ptxas warning : Unresolved extern function"
  assert ptxas_warnings("ptxas info    : Used 90 registers\n", "dq_kernel") == []


def test_tpu_kernels_are_named_and_their_vmem_read():
  line = ('  %x = f32[8] custom-call(%a), custom_call_target="tpu_custom_call", metadata={op_name="jit(f)/'
          'transpose(jvp(forgetting_attention_tpu_dkv))/pallas_call"}, backend_config={"custom_call_config":{},'
          '"used_scoped_memory_configs":[{"memory_space":"1","offset":"0","size":"2027520"}]}')
  [report] = tpu_reports("ENTRY {\n" + line + "\n}")
  assert (report.name, report.compiler, report.vmem_bytes) == ("forgetting_attention_tpu_dkv", "mosaic-tpu", 2027520)


@pytest.mark.parametrize("version, isa", [((12, 4, 131), 84), ((12, 6, 85), 85), ((12, 9, 86), 88), ((13, 0, 48), 90),
                                          ((13, 4, 0), 94), (None, None)])
def test_the_ptx_isa_a_ptxas_takes(monkeypatch, version, isa):
  monkeypatch.setattr(target, "ptxas_version", lambda: version)
  assert target.ptx_isa_version() == isa


@pytest.mark.parametrize("version, refused", [((12, 8, 61), True), ((12, 9, 41), True), ((12, 9, 86), False),
                                              ((12, 6, 85), False), ((13, 0, 48), False)])
def test_mosaic_gpu_refuses_the_ptxas_that_miscompiles_causal_masks(monkeypatch, version, refused):
  monkeypatch.setattr(mosaic_gpu, "on_gpu", lambda: True)
  monkeypatch.setattr(mosaic_gpu, "compute_capability", lambda: "9.0")
  monkeypatch.setattr(mosaic_gpu, "ptxas_version", lambda: version)
  if not refused:
    mosaic_gpu.check_runnable(interpret=False)
    return
  with pytest.raises(ValueError, match="miscompiles causal masks") as error:
    mosaic_gpu.check_runnable(interpret=False)
  assert "\n" not in str(error.value)


@pytest.mark.parametrize("window", [None, 1, 100, 300])
def test_window_bounds_on_numpy_starts_are_numpy_and_equal_the_traced_ones(window):
  """The TPU wrapper's static visit ranges run on the host (an ahead-of-time compile's default
  device is a chip that is absent): numpy in, numpy out, the same bounds as for jax ints."""
  starts = np.arange(0, 1024, 128)
  first = block_sizes.first_key_block_in_window(starts, 64, window)
  end = block_sizes.query_block_end_in_window(starts - 256, 64, 128, 8, window)
  for numpy_bound, jax_bound in ((first, block_sizes.first_key_block_in_window(jnp.asarray(starts), 64, window)),
                                 (end, block_sizes.query_block_end_in_window(jnp.asarray(starts) - 256, 64, 128, 8,
                                                                             window))):
    assert not hasattr(numpy_bound, "devices")  # not a jax array
    np.testing.assert_array_equal(numpy_bound, np.asarray(jax_bound))


def test_compile_for_answers_bad_requests_in_one_line(tmp_path):
  """train.py --compile-for: an unknown target before JAX starts, --json alone, --resume with it;
  without the compilers (jax 0.10 here), what to install. Nothing is written."""
  import subprocess
  import sys

  from conftest import REPO
  run = lambda *args: subprocess.run([sys.executable, str(REPO / "train.py"), *args], capture_output=True,
                                     text=True, cwd=tmp_path)
  result = run("--compile-for", "h300")
  assert result.returncode == 2 and result.stderr.strip().startswith("error: unknown target 'h300'; targets look like")
  for args, message in ((["--json", "plan.json"], "--json goes with --compile-for"),
                        (["--compile-for", "h100", "--resume"], "--compile-for compiles a step and trains nothing")):
    result = run(*args)
    assert result.returncode == 2 and message in result.stderr
  if not installed("jax_plugins.xla_cuda12"):
    result = run("--compile-for", "h100x8")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()] and "no GPU compiler here" in result.stderr
  assert list(tmp_path.iterdir()) == []


def test_a_step_that_does_not_fit_gets_the_compiled_overrides_that_do(monkeypatch):
  """The candidates are compiled in order, cheapest first, and the line names the ones that fit
  (here plan_step stands in for the compiler: the compiles themselves are in
  tests/training/test_compile_for.py, CI's Python 3.12 leg)."""
  from lpcjax import experiment
  from lpcjax.aot import plan

  from conftest import REPO
  config = experiment.apply_overrides(experiment.load_experiment(str(REPO / "configs" / "fox_tiny_mqar.py")),
                                      ["train.mesh_data=8"])
  assert plan.candidates(config, "h100x8")[:3] == [
      ["train.mesh_fsdp=8", "train.mesh_data=1", "train.mesh_context=1", "train.mesh_tensor=1"],
      ["train.mesh_fsdp=8", "train.mesh_data=1", "train.mesh_context=1", "train.mesh_tensor=1",
       "model.remat_policy=full"],
      ["train.mesh_fsdp=8", "train.mesh_data=1", "train.mesh_context=1", "train.mesh_tensor=1",
       "model.remat_policy=full", "train.grad_accum_steps=2"]]
  gib = plan.GiB
  compiled = []

  def fake_plan(config, target, overrides=()):
    compiled.append(tuple(overrides))
    total = {0: 100, 1: 90, 2: 70, 3: 60}.get(len(compiled) - 1, 50) * gib  # falls as the candidates go on
    return plan.StepPlan(target="h100x8", devices=8, chip_memory=80 * gib, mesh={"data": 1, "fsdp": 8},
                         overrides=tuple(overrides), params=0, optimizer_state=0, batch=0, arguments=total,
                         outputs=0, temporaries=0, aliased=0, code=0, model_flops=0.0, compiler_flops=0.0,
                         estimated_seconds=0.0, collectives={})

  monkeypatch.setattr(plan, "plan_step", fake_plan)
  printed = []
  assert plan.compile_for(config, "h100x8", print_line=printed.append) == 1
  assert len(compiled) == 4  # the plan, then candidates until two fit
  assert printed[-1] == ("does not fit: 20.00 GiB over; compiled and fitting: " + " ".join(compiled[2])
                         + " (70.00 GiB, mesh data 1 x fsdp 8); or " + " ".join(compiled[3])
                         + " (60.00 GiB, mesh data 1 x fsdp 8)")


def test_collectives_are_read_from_the_compiled_program():
  from lpcjax.aot.plan import collectives
  hlo = """
  %all-reduce.1 = f32[1024,768]{1,0} all-reduce(f32[1024,768]{1,0} %x), replica_groups={{0,1}}
  %ag = (bf16[8,128]{1,0}, bf16[64,128]{1,0}) all-gather-start(bf16[8,128]{1,0} %y), dimensions={0}
  %cp = u32[] collective-permute(u32[] %z), source_target_pairs={{0,1}}
  %add = f32[4]{0} add(f32[4]{0} %a, f32[4]{0} %b)
  """
  assert collectives(hlo) == {"all-reduce": {"count": 1, "bytes": 4 * 1024 * 768},
                              "all-gather": {"count": 1, "bytes": 2 * 64 * 128},
                              "collective-permute": {"count": 1, "bytes": 4}}


def test_a_step_libtpu_refuses_for_its_memory_is_a_plan_that_does_not_fit():
  from lpcjax.aot.plan import GiB, refused_plan
  message = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries (19.08G) "
             "exceeds available HBM (15.75G). HLO module: jit_train_step.")
  fixed = dict(target="v5e-16", devices=16, mesh={"data": 16}, overrides=(), params=2 * GiB, optimizer_state=4 * GiB,
               batch=2**20)
  plan = refused_plan(fixed, message)
  assert (plan.total, plan.chip_memory) == (int(19.08 * GiB), int(15.75 * GiB)) and not plan.fits
  assert plan.lines()[-1].startswith("total    does not fit: the compiler refused the step, 19.08 GiB against the "
                                     "15.75 GiB it can use per device (")
  assert plan.to_json()["fits"] is False and plan.to_json()["margin"] < 0
  assert refused_plan(fixed, "INTERNAL: something else") is None

import os
import pathlib

# Eight virtual CPU devices for the multi-device tests; must be set before JAX starts.
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

# The tests' models are tiny: compiling them is most of the suite's time and running them little.
# LLVM's -O0 for the CPU backend cuts the compile time (and the CPU time of the suite) by about a
# third (measured on the kernel and evaluation tests); the HLO passes, whose output some tests
# read, are not LLVM's. Set XLA_FLAGS with another level to override.
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + " --xla_backend_optimization_level=0").strip()

# On GPUs float32 matmuls default to TF32; the tests compare float32 results to ~1e-5.
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")

# Many tests compile the same tiny functions (a model's train step, a kernel at one shape), in
# this process, the other xdist worker and the train.py subprocesses: a persistent compilation
# cache shared by all of them for this session compiles each once (a third off the model tests'
# time, measured). The directory is new per session, made by the first process that imports this
# file (xdist's controller; its workers and subprocesses inherit the variable) and removed by it.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  import atexit
  import shutil
  import tempfile

  _cache = tempfile.mkdtemp(prefix="lpcjax-test-jax-cache-")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
  os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  _owner = os.getpid()
  atexit.register(lambda: os.getpid() == _owner and shutil.rmtree(_cache, ignore_errors=True))

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def _import_the_project_as_installed():
  """Take the checkout's root off sys.path (`python -m pytest` and xdist's workers put the current
  directory there): the tests import lpcjax as a user's install does, where ./kernels is
  `lpcjax.kernels`. On the path, ./kernels shadows PyPI's unrelated `kernels`, which transformers
  (>= 5.25, in the peer extra) imports, and the peer tests' import of fla fails."""
  import sys
  sys.path[:] = [entry for entry in sys.path
                 if pathlib.Path(entry or os.curdir).resolve() != REPO]


_import_the_project_as_installed()

# The tests left out of the README's command (`-m "not slow"`, what CI runs), beside the ones
# marked in their files: the slowest of the full suite's `--durations` (2 CPU cores, Dec 2026),
# each an end-to-end run or a variant whose behaviour a faster test of the command also covers
# (one mesh of several, one parametrization of several). `python -m pytest -q -n 2 -m slow tests`
# runs them (docs/testing.md).
SLOW = {
    "tests/training/test_context_parallel_training.py::test_training_matches_and_resumes_across_meshes",
    "tests/training/test_context_parallel_training.py::test_model_on_a_context_mesh_equals_one_device[fox-pro-mesh1-None]",
    "tests/training/test_context_parallel_training.py::test_model_on_a_context_mesh_equals_one_device[transformer-llama-mesh2-None]",
    "tests/training/test_context_parallel_training.py::test_model_on_a_context_mesh_equals_one_device[fox-pro-mesh3-None]",
    "tests/training/test_context_parallel_training.py::test_model_on_a_context_mesh_equals_one_device[fox-llama-mesh4-12]",
    "tests/training/test_context_parallel_training.py::test_compiled_step_moves_the_sequence_only_by_collective_permute[model1]",
    "tests/training/test_distributed.py::test_resume_with_accumulation_on_a_mesh_is_exact[tokens]",
    "tests/training/test_distributed.py::test_resume_on_another_mesh_reshards",
    "tests/training/test_distributed.py::test_resume_is_exact_and_survives_sigterm",
    "tests/training/test_distributed.py::test_mesh_and_single_device_give_the_same_losses",
    "tests/training/test_training.py::test_debug_checks_catch_bad_values_inside_training",
    "tests/training/test_training.py::test_a_stopped_run_prints_the_command_that_resumes_it",
    "tests/training/test_custom_family.py::test_a_fresh_process_evaluates_and_generates_a_family_defined_outside_the_package",
    "tests/evaluation/test_pmt_family.py::test_pretrain_then_probe",
    "tests/evaluation/test_pmt_family.py::test_probe_of_a_one_class_file_is_a_one_line_error",
    "tests/evaluation/test_evaluation.py::test_needle_generated_answers_agree_with_teacher_forced",
    "tests/evaluation/test_delayed_identifier.py::test_eval_delayed_id_on_an_lpcsm_run",
    "tests/layers/test_lpcsm_layers.py::test_local_attention_streaming_equals_the_windowed_kernel[none]",
    "tests/models/test_lpcsm.py::test_causal_and_streaming_equals_one_pass[no_mhc_no_pc]",
    "tests/models/test_lpcsm.py::test_causal_and_streaming_equals_one_pass[no_slow_no_ont]",
    "tests/models/test_pmt.py::test_receptive_field_example",
    "tests/models/test_pmt_losses.py::test_family_loss_is_finite_with_missing_values_and_weights_switch_losses_off",
    "tests/models/test_nnx.py::test_decoder_lm_through_nnx_bridge",
    "tests/kernels/test_pallas_tpu.py::test_bfloat16_window_segments_and_pruning",
    # its own compile of the PMT loss's gradient (57 s); the fast set's
    # test_gates_move_off_their_init_in_a_few_dozen_steps sees the write gate's opening move
    "tests/models/test_pmt_train.py::test_the_write_gate_has_a_gradient_at_init",
}


def pytest_collection_modifyitems(config, items):
  for item in items:
    if item.nodeid in SLOW or item.nodeid.split("[")[0] in SLOW:
      item.add_marker(pytest.mark.slow)
SHARED_DATA = REPO.parent / "shared" / "data"
# Small real data shipped with the tests (tests/fixtures/README.md), so that a fresh clone runs
# every test CI runs: text for the tokenizer, needle and probe tests, UCR samples for the series.
FIXTURES = REPO / "tests" / "fixtures"
TEXT = FIXTURES / "text" / "shakespeare.txt"  # plain UTF-8, LF
BOOK = FIXTURES / "text" / "frankenstein_letter1.txt.gz"  # as Project Gutenberg stores it: BOM, CRLF
UCR = FIXTURES / "ucr"


@pytest.fixture
def no_persistent_cache():
  """For a test that counts backend compilations: a hit in the session's cache skips one."""
  import jax

  jax.config.update("jax_enable_compilation_cache", False)
  yield
  jax.config.update("jax_enable_compilation_cache", True)


@pytest.fixture
def shared_data():
  """../shared/data beside the checkout: only the tests of the full corpora need it (they skip
  in a user's fresh clone); everything else reads tests/fixtures."""
  if not SHARED_DATA.is_dir():
    pytest.skip("../shared/data is not present")
  return SHARED_DATA


@pytest.fixture(scope="session")
def gpt2_rank_file(tmp_path_factory):
  """The path of GPT-2's tiktoken rank file (MIT, OpenAI), unpacked once per session from the
  gzipped copy lpcjax ships (lpcjax/data/gpt2.tiktoken.gz): the real tokenizer, offline, in a
  file of its own that a test may copy, pass or take away."""
  import gzip
  path = tmp_path_factory.mktemp("tokenizer") / "gpt2.tiktoken"
  with gzip.open(REPO / "lpcjax" / "data" / "gpt2.tiktoken.gz") as packed:
    path.write_bytes(packed.read())
  return str(path)


@pytest.fixture
def x64():
  """jax_enable_x64 on for one test (a user's codebase may set it): Python ints then trace as
  int64, which once broke the Pallas kernels where they met int32 program ids."""
  import jax
  previous = jax.config.jax_enable_x64
  jax.config.update("jax_enable_x64", True)
  yield
  jax.config.update("jax_enable_x64", previous)


@pytest.fixture
def repo_root():
  return REPO


os.environ.setdefault("TQDM_DISABLE", "1")


def cli(name):
  """The ``main`` of train.py or eval.py, loaded from the checkout (as a user runs them)."""
  import importlib.util
  spec = importlib.util.spec_from_file_location(f"{name}_cli", REPO / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.main


def ctrl_c_swallowed_by_the_interpreter():
  """SIGINT delivered inside a __del__, where Python swallows the KeyboardInterrupt (prints
  'Exception ignored' and carries on), as it does when the signal lands in JAX's GC callback.

  The handler must run inside this __del__ and nowhere else: Python runs it at its next check
  between bytecodes, and if a garbage collection came first, that check could be inside another
  library's gc callback (hypothesis installs one), whose KeyboardInterrupt then surfaced as a
  PytestUnraisableExceptionWarning in whatever test ran later. So no collection may start while
  the signal is pending, and a Python loop (its backward jump is such a check) runs it here."""
  import gc
  import signal

  class Collected:
    def __del__(self):
      signal.raise_signal(signal.SIGINT)
      for _ in range(100):  # the Python-level handler runs here, inside __del__
        pass

  collecting = gc.isenabled()
  gc.disable()
  try:
    Collected()
  finally:
    if collecting:
      gc.enable()


def tiny_arguments(tmp_path, *overrides, name="run"):
  """The overrides of ``tiny_experiment`` (on configs/fox_tiny_mqar.py), as train.py takes
  them; ``name=None``: no train.run_name (train.py names the run by its start time)."""
  mqar = ["model.vocab_size=64", "data.mqar_vocab_size=64", "data.mqar_num_pairs=4"]
  if any(item.startswith("data.kind=") for item in overrides):
    mqar = []
  # the paper's gate init, for the families that have a gate (a family override applies first)
  gate = [] if any(item.startswith("model.family=") and item != "model.family=fox" for item in overrides) \
      else ["model.gate_bias_init=zero"]
  return [*mqar, "model.block=llama", *gate, "data.seq_len=32", "data.batch_size=8",
          "model.d_model=32", "model.mlp_multiple_of=32",
          "train.steps=30", "train.warmup_steps=5", "train.log_every=10", "train.eval_batches=2",
          f"train.run_dir={tmp_path}", *([f"train.run_name={name}"] if name else []), *overrides]


def tiny_experiment(tmp_path, *overrides, name="run"):
  """A seconds-long FoX-on-MQAR experiment writing under tmp_path/name. With a
  ``data.kind=...`` override the MQAR-only defaults are left out. The model is the default job's
  with the LLaMA block and the paper's gate init (the tests' model since before the default
  job moved to the Pro block; a test that needs Pro says so)."""
  from lpcjax import experiment as C
  cfg = C.load_experiment(str(REPO / "configs" / "fox_tiny_mqar.py"))
  return C.apply_overrides(cfg, tiny_arguments(tmp_path, *overrides, name=name))


def write_token_file(prefix, num_tokens, seed=0, tokenizer_sha256=None):
  """A token file as ``python -m lpcjax.data`` writes it, without tokenizing: random GPT-2 ids
  (uint16), one document; evaluation checks ``tokenizer_sha256`` when given."""
  import json
  import numpy as np
  tokens = np.random.default_rng(seed).integers(0, 50257, num_tokens).astype(np.uint16)
  tokens.tofile(f"{prefix}.bin")
  with open(f"{prefix}.json", "w") as f:
    json.dump({"num_tokens": num_tokens, "doc_starts": [0], "num_documents": 1,
               "tokenizer_sha256": tokenizer_sha256}, f)
  return str(prefix)


def sigterm_after_rows(monkeypatch, rows=3):
  """Make the trainer send itself SIGTERM right after logging its ``rows``-th training row: a
  preemption at a known step, delivered the way a scheduler delivers it (the trainer's signal
  handler is installed then, so the run stops after that step)."""
  import signal
  from lpcjax.training import loop
  write, logged = loop.MetricsLog.write, []

  def write_then_preempt(self, record):
    write(self, record)
    if "loss" in record:
      logged.append(record["step"])
      if len(logged) == rows:
        os.kill(os.getpid(), signal.SIGTERM)

  monkeypatch.setattr(loop.MetricsLog, "write", write_then_preempt)
  return logged

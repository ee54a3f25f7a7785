import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpcjax import experiment as C
from lpcjax import models
from lpcjax.losses import masked_cross_entropy
from lpcjax.training import TrainingError, create_train_state, decay_mask, has_checkpoint, train, train_step

from conftest import REPO, cli, ctrl_c_swallowed_by_the_interpreter, sigterm_after_rows, tiny_arguments, tiny_experiment


def one_device():
  return jax.devices()[:1]


def test_masked_cross_entropy_matches_direct_computation():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 5, 7)).astype(np.float32)
  targets = rng.integers(0, 7, size=(2, 5))
  mask = (rng.uniform(size=(2, 5)) > 0.5).astype(np.float32)
  losses, hits = masked_cross_entropy(jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(mask))
  log_z = np.log(np.exp(logits.astype(np.float64)).sum(-1))
  direct = (log_z - np.take_along_axis(logits, targets[..., None], -1)[..., 0]) * mask
  np.testing.assert_allclose(losses, direct, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(hits, (logits.argmax(-1) == targets) * mask)


def test_weight_decay_only_on_matrices(tmp_path):
  cfg = tiny_experiment(tmp_path, "model.block=pro")
  state = create_train_state(models.get("fox"), models.get("fox").build(cfg.model), cfg)
  mask = decay_mask(state.params)
  assert mask["embed"]["embedding"] and mask["layers"]["attn"]["q_proj"]["kernel"]
  assert not mask["layers"]["attn"]["forget_gate"]["proj"]["bias"]
  assert not mask["layers"]["attn_norm"]["scale"] and not mask["final_norm"]["scale"]


def test_gradient_accumulation_equals_one_big_batch(tmp_path):
  # Micro-batch k holds rows k, k + 4 (see steps.micro_batches); its masks score 3, 14, 24 and 64
  # positions, so averaging the micro-batches' mean losses would weigh positions unequally.
  import optax
  cfg = tiny_experiment(tmp_path)
  # Plain SGD with rate 1: the step moves each parameter by exactly minus its gradient.
  state = create_train_state(models.get("fox"), models.get("fox").build(cfg.model), cfg, optimizer=optax.sgd(1.0))
  rng = np.random.default_rng(0)
  mask = np.zeros((8, 32), np.float32)
  for row, count in zip((0, 4, 1, 5, 2, 6, 3, 7), (1, 2, 7, 7, 12, 12, 32, 32)):
    mask[row, rng.choice(32, count, replace=False)] = 1.0
  batch = {"inputs": jnp.asarray(rng.integers(0, 64, (8, 32))), "targets": jnp.asarray(rng.integers(0, 64, (8, 32))),
           "loss_mask": jnp.asarray(mask)}
  one, m1 = jax.jit(train_step)(state, batch)
  four, m4 = jax.jit(train_step, static_argnames="accum_steps")(state, batch, accum_steps=4)
  assert float(m4["loss"][1]) == float(m1["loss"][1]) == mask.sum()
  np.testing.assert_allclose(m4["loss"][0], m1["loss"][0], rtol=1e-6)
  np.testing.assert_allclose(m4["grad_norm"][0], m1["grad_norm"][0], rtol=1e-5)
  moved = 0
  for a, b, before in zip(jax.tree.leaves(one.params), jax.tree.leaves(four.params), jax.tree.leaves(state.params)):
    np.testing.assert_allclose(np.asarray(b) - before, np.asarray(a) - before, rtol=1e-4, atol=1e-8)
    moved += int(np.any(np.asarray(a) != np.asarray(before)))
  assert moved == len(jax.tree.leaves(state.params))  # every parameter took a step


def test_debug_checks_catch_bad_values_inside_training(tmp_path):
  """With model.debug_checks the attention op's value checks run inside the jitted step: a NaN
  weight is reported as an error naming the op; without them the step only skips the update."""
  from lpcjax.training.loop import compiled_steps
  for debug in (True, False):
    cfg = tiny_experiment(tmp_path, f"model.debug_checks={str(debug).lower()}")
    family = models.get("fox")
    state = create_train_state(family, family.build(cfg.model), cfg)
    wq = state.params["layers"]["attn"]["q_proj"]["kernel"]
    state = state.replace(params={**state.params, "layers": {**state.params["layers"], "attn": {
        **state.params["layers"]["attn"], "q_proj": {"kernel": wq.at[0, 0, 0].set(jnp.nan)}}}})
    train_fn, _ = compiled_steps(family, cfg, None)
    batch = {"inputs": jnp.ones((8, 32), jnp.int32), "targets": jnp.ones((8, 32), jnp.int32),
             "loss_mask": jnp.ones((8, 32))}
    if debug:
      with pytest.raises(Exception, match="q, k or v holds a NaN"):
        train_fn(state, batch)
    else:
      _, metrics = train_fn(state, batch)
      assert float(metrics["finite"][0]) == 0.0


def test_nonfinite_loss_skips_the_update(tmp_path):
  cfg = tiny_experiment(tmp_path)
  state = create_train_state(models.get("fox"), models.get("fox").build(cfg.model), cfg)
  batch = {"inputs": jnp.zeros((8, 32), jnp.int32), "targets": jnp.zeros((8, 32), jnp.int32),
           "loss_mask": jnp.ones((8, 32))}
  nan_loss = lambda apply_fn, params, batch, **_: (jnp.nan * jax.tree.leaves(params)[0].sum(),
                                                   {"loss": (jnp.nan, 1.0)}, {})
  new, metrics = jax.jit(train_step, static_argnames="loss_fn")(state, batch, loss_fn=nan_loss)
  assert float(metrics["finite"][0]) == 0.0 and int(new.step) == int(state.step)
  for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(state.params)):
    np.testing.assert_array_equal(a, b)


def test_train_writes_a_restorable_run_directory(tmp_path):
  cfg = tiny_experiment(tmp_path)
  run_dir, summary = train(cfg, progress=False, devices=one_device())
  records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
  losses = [r["loss"] for r in records if "loss" in r]
  assert len(losses) == 3 and losses[-1] < losses[0]
  assert summary["eval_weight"] == 2 * 8 * 4 and summary["eval_examples"] == 2 * 8 and not summary["preempted"]
  saved = C.from_dict(json.load(open(os.path.join(run_dir, "config.json"))))
  assert saved == cfg
  with pytest.raises(FileExistsError, match="already holds checkpoints"):
    train(cfg, progress=False, devices=one_device())


def test_evaluation_restores_parameters_only(tmp_path, monkeypatch):
  """load_run reads the params (and mutable collections) of a full TrainState checkpoint and
  never its optimizer state: the full restore is not called, and the params are the same."""
  from lpcjax.runs import load_run
  from lpcjax.sharding import make_mesh
  from lpcjax.training import Checkpointer, restore_state
  run_dir, _ = train(tiny_experiment(tmp_path, "train.steps=1", "train.warmup_steps=0", "train.eval_batches=1"),
                     progress=False, devices=one_device())
  mesh = make_mesh(C.TrainConfig(), one_device())
  with jax.set_mesh(mesh):
    _, _, _, full = restore_state(run_dir, mesh, ())

  def no_full_restore(*args, **kwargs):
    raise AssertionError("evaluation restored the whole TrainState")

  monkeypatch.setattr(Checkpointer, "restore", no_full_restore)
  run = load_run(run_dir, mesh=mesh)
  assert run.step == int(full.step) == 1
  for a, b in zip(jax.tree.leaves(run.params), jax.tree.leaves(full.params), strict=True):
    np.testing.assert_array_equal(a, b)


def test_train_cli_rejects_bad_input_with_one_line(tmp_path):
  one_device = {**os.environ, "XLA_FLAGS": ""}  # as a user's single-CPU run
  result = subprocess.run([sys.executable, str(REPO / "train.py"), "model.d_modle=3"],
                          capture_output=True, text=True, cwd=tmp_path, env=one_device)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      "error: model.d_modle: unknown key for model.family='fox' (did you mean model.d_model?); known keys are "
      + result.stderr.split("known keys are ")[1].strip()]
  result = subprocess.run([sys.executable, str(REPO / "train.py"), "--config", "fox_tiny_text",
                           "data.train_files=/nonexistent.txt", "data.tokenizer_file=/nonexistent.tiktoken",
                           f"train.run_dir={tmp_path}"],
                          capture_output=True, text=True, cwd=tmp_path, env=one_device)
  # the data file is checked before JAX loads, the tokenizer's when the data is read
  assert result.returncode == 2 and result.stderr == "error: data.train_files: no such file: /nonexistent.txt\n"


def test_a_stopped_run_prints_the_command_that_resumes_it(tmp_path, monkeypatch, capsys):
  """python train.py without a run name, stopped after step 2: the start block and the last line
  give the command that continues it (a bare --resume cannot name a run named by its start
  time), and that command finishes the run. Log rows hold the learning rate, step time,
  throughput and MFU (train.peak_tflops: a CPU's peak is unknown); the progress bar ends at N/N;
  summary.json counts the time of both parts."""
  import shlex
  from lpcjax.runs import load_run
  sigterm_after_rows(monkeypatch, rows=2)
  arguments = tiny_arguments(tmp_path, "train.steps=4", "train.warmup_steps=1", "train.log_every=1",
                             "train.eval_batches=1", "train.peak_tflops=2", name=None)
  assert cli("train")(arguments) == 130
  out, err = capsys.readouterr()
  (run_dir,) = [tmp_path / name for name in os.listdir(tmp_path)]
  command = err.strip().splitlines()[-1].split("continue with: ")[1]
  assert command.endswith(f"train.run_name={run_dir.name} --resume")
  assert f"resume   {command}" in out.splitlines()  # printed before the first step too
  assert cli("train")([*arguments, "--resume"]) == 2  # a bare --resume: which run?
  assert capsys.readouterr().err.strip() == ("error: train.run_name: --resume needs the name of the run to continue: "
                                             f"train.run_name=NAME (runs in {tmp_path}: {run_dir.name})")
  assert "config   fox_tiny_mqar: fox (llama), " in out and "mesh data 8 x fsdp 1 x context 1 x tensor 1" in out
  summary = json.load(open(run_dir / "summary.json"))
  summary["train_seconds"] = 1000.0  # as if the first part had trained for long
  json.dump(summary, open(run_dir / "summary.json", "w"))

  _python, _script, *resumed = shlex.split(command)
  assert cli("train")(resumed) == 0
  _, err = capsys.readouterr()
  assert "4/4" in err and "| 3/4 [" not in err.split("\r")[-1]  # the bar's last state
  assert json.load(open(run_dir / "summary.json"))["train_seconds"] > 1000.0
  rows = [row for row in map(json.loads, open(run_dir / "metrics.jsonl")) if "loss" in row]
  peak_lr = json.load(open(run_dir / "config.json"))["train"]["learning_rate"]
  assert [row["step"] for row in rows] == [1, 2, 3, 4]
  assert rows[0]["learning_rate"] == 0.0 and rows[1]["learning_rate"] == pytest.approx(peak_lr)  # warm-up of 1
  run = load_run(str(run_dir))
  flops_per_token = models.get("fox").flops_per_unit(run.config, run.params)
  for row in rows:
    assert row["tokens_per_sec"] == pytest.approx(8 * 32 / row["step_seconds"])
    assert row["mfu"] == pytest.approx(flops_per_token * row["tokens_per_sec"] / (8 * 2e12))


def test_the_start_block_names_the_data_and_the_resume_command():
  from lpcjax.sharding import make_mesh
  from lpcjax.training.loop import start_block
  text = C.apply_overrides(C.load_experiment(str(REPO / "configs" / "fox_tiny_text.py")),
                           ["data.train_files=a.txt,b.txt,c.txt,d.txt,e.txt"])
  lines = start_block(text, 1234, make_mesh(text.train, one_device()), "runs/x", 5, lambda name: f"resume {name}")
  assert lines[0] == "config   fox_tiny_text: fox (llama), 1,234 parameters"
  assert lines[2] == "data     text, batch 4 x 256; train_files=a.txt,b.txt,c.txt (+2 more)"
  assert lines[3] == ("eval     the training text (a.txt, b.txt, c.txt (+2 more); no data.eval_files): its loss there "
                      "is a training loss, not a held-out one")
  assert lines[4].endswith("; resuming at step 5") and lines[-1] == "resume   resume x"
  held_out = C.apply_overrides(text, ["data.eval_files=held.txt"])
  assert start_block(held_out, 1, make_mesh(text.train, one_device()), "runs/x", 0)[3] == "eval     text held.txt"
  mqar = C.load_experiment(str(REPO / "configs" / "fox_tiny_mqar.py"))
  assert start_block(mqar, 1, make_mesh(mqar.train, one_device()), "runs/x", 0)[3] == (
      "eval     generated mqar examples of the held-out split (seeded apart from the training examples)")


def test_a_family_that_cannot_split_its_sequence_is_named_before_the_mesh(tmp_path):
  """One device and mesh_context=2 on LPC-SM: the error names the family (the mesh's own error
  blamed train.mesh_data)."""
  cfg = C.apply_overrides(C.load_experiment(str(REPO / "configs" / "fox_tiny_mqar.py")),
                          ["model.family=lpcsm", "train.mesh_context=2", f"train.run_dir={tmp_path}"])
  with pytest.raises(C.ConfigError, match="train.mesh_context: the lpcsm family cannot shard its sequence"):
    train(cfg, progress=False, devices=one_device())
  assert os.listdir(tmp_path) == []


def test_tensorboard_event_files(tmp_path):
  pytest.importorskip("tensorboardX")
  cfg = tiny_experiment(tmp_path, "train.tensorboard=true", "train.steps=2", "train.warmup_steps=1",
                        "train.log_every=1")
  run_dir, _ = train(cfg, progress=False, devices=one_device())
  assert any(name.startswith("events.out.tfevents") for name in os.listdir(os.path.join(run_dir, "tensorboard")))


def test_run_stops_after_nonfinite_steps_and_saves_nothing(tmp_path):
  import dataclasses
  from typing import ClassVar

  @dataclasses.dataclass(frozen=True)
  class NaNConfig(models.FoXConfig):
    family: ClassVar[str] = "nan_fox_for_tests"

  nan_loss = lambda apply_fn, params, batch, **_: (
      jnp.nan * jax.tree.leaves(params)[0].sum(), {"loss": (jnp.nan, 1.0)}, {})
  if "nan_fox_for_tests" not in models.names():
    models.register(models.language_model_family("nan_fox_for_tests", NaNConfig, models.DecoderLM, loss=nan_loss))
  base = tiny_experiment(tmp_path, "train.max_nonfinite_steps=3", "train.mesh_data=1", name="nan")
  cfg = dataclasses.replace(base, model=NaNConfig(**{f.name: getattr(base.model, f.name)
                                                     for f in dataclasses.fields(base.model)}))
  with pytest.raises(TrainingError, match="3 non-finite losses in a row at step 3; stopped without saving"):
    train(cfg, progress=False, devices=one_device())
  assert not has_checkpoint(os.path.join(tmp_path, "nan"))


def test_init_from_starts_a_new_run_from_another_runs_weights(tmp_path):
  from lpcjax.runs import load_run
  from lpcjax.training import RunError
  common = ("train.warmup_steps=1", "train.mesh_data=1", "train.log_every=1")
  source = tiny_experiment(tmp_path, "train.steps=3", "train.checkpoint_every=1", *common, name="a")
  source_dir, _ = train(source, progress=False, devices=one_device())
  # A later stage: longer sequences, new data position and optimizer. One step whose learning
  # rate is 0 (warmup from 0) leaves the weights as they came, so they must equal the source's.
  for spec, step in ((source_dir, 3), (f"{source_dir}:2", 2)):
    stage = tiny_experiment(tmp_path, "train.steps=1", "data.seq_len=64", f"train.init_from={spec}", *common,
                            name=f"b{step}")
    stage_dir, _ = train(stage, progress=False, devices=one_device())
    source_params = load_run(source_dir, step=step).params
    for a, b in zip(jax.tree.leaves(load_run(stage_dir).params), jax.tree.leaves(source_params)):
      np.testing.assert_array_equal(a, b)
  wider = tiny_experiment(tmp_path, "train.steps=1", "model.d_model=64", f"train.init_from={source_dir}", *common,
                          name="c")
  with pytest.raises(C.ConfigError, match=r"train.init_from: \['embed'\]\['embedding'\] is float32\[64, 32\] in .*a "
                                          r"\(step 3\), this model needs float32\[64, 64\]"):
    train(wider, progress=False, devices=one_device())
  with pytest.raises(RunError, match="no checkpoint at step 7"):
    train(C.apply_overrides(wider, [f"train.init_from={source_dir}:7", "model.d_model=32"]), progress=False,
          devices=one_device())


def test_resume_semantics_never_lose_or_relabel_a_checkpoint(tmp_path):
  from lpcjax.training import RunError
  common = ("train.warmup_steps=1", "train.mesh_data=1", "train.log_every=1", "train.checkpoint_every=2")
  cfg = tiny_experiment(tmp_path, "train.steps=6", *common, name="r")
  with pytest.raises(RunError, match="no checkpoint to resume"):
    train(cfg, resume=True, progress=False, devices=one_device())
  assert not os.path.exists(tmp_path / "r")
  run_dir, _ = train(cfg, resume="or_start", progress=False, devices=one_device())
  checkpoints = sorted(os.listdir(os.path.join(run_dir, "checkpoints")))
  metrics = open(os.path.join(run_dir, "metrics.jsonl")).read()
  with pytest.raises(C.ConfigError, match="train.steps: .* is already at step 6, past train.steps=4"):
    train(C.apply_overrides(cfg, ["train.steps=4"]), resume=True, progress=False, devices=one_device())
  _, summary = train(cfg, resume=True, progress=False, devices=one_device())
  assert summary["already_complete"] and summary["step"] == 6
  assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == checkpoints  # nothing renamed or deleted
  assert open(os.path.join(run_dir, "metrics.jsonl")).read() == metrics
  # Killed after the step-4 checkpoint, with steps 5 and 6 already logged: resuming logs them once.
  import shutil
  shutil.rmtree(os.path.join(run_dir, "checkpoints", "6"))
  train(C.apply_overrides(cfg, ["train.steps=8"]), resume=True, progress=False, devices=one_device())
  steps = [json.loads(line)["step"] for line in open(os.path.join(run_dir, "metrics.jsonl"))
           if "loss" in json.loads(line)]
  assert steps == list(range(1, 9))


@pytest.mark.parametrize("impl,platform", [("pallas_tpu", "tpu"), ("pallas", "gpu"), ("triton", "gpu")])
def test_a_backend_that_cannot_run_here_is_one_line_before_anything_is_written(impl, platform, tmp_path, capsys):
  """The config check cannot know where a run will run; train() asks the backend table first."""
  from lpcjax.kernels import ordered_backends
  if jax.default_backend() == platform:
    pytest.skip(f"{impl} runs here")
  here = ", ".join(["auto", *(backend.name for backend in ordered_backends() if backend.runs_natively())])
  assert jax.default_backend() != "cpu" or here == "auto, xla, reference"
  code = cli("train")(tiny_arguments(tmp_path, f"model.attention_impl={impl}", "model.head_dim=16", name="x"))
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and err == [f"error: model.attention_impl: impl={impl!r} runs on {platform}, and this machine is "
                               f"{jax.default_backend()}; backends that run here: {here}"]
  assert not os.path.exists(tmp_path / "x")


def test_mesh_errors_are_one_line_and_write_nothing(tmp_path):
  result = subprocess.run([sys.executable, str(REPO / "train.py"), "train.mesh_data=3", f"train.run_dir={tmp_path}"],
                          capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "XLA_FLAGS": ""})
  assert result.returncode == 2
  assert result.stderr.strip() == ("error: train.mesh_data: data x fsdp x context x tensor = 3 x 1 x 1 x 1 needs 3 "
                                   "devices, found 1")
  from lpcjax.sharding import make_mesh  # the field the user set is named, not train.mesh_data=-1
  count = len(jax.devices())
  with pytest.raises(C.ConfigError, match=rf"^train.mesh_tensor: the mesh axes of fixed size take 3 devices, which "
                                          rf"does not divide the {count} devices found \(train.mesh_data=-1 takes "
                                          r"the rest\)$"):
    make_mesh(C.TrainConfig(mesh_tensor=3))
  if len(jax.devices()) >= 8:
    cfg = tiny_experiment(tmp_path, "train.mesh_tensor=8", "train.mesh_data=1", name="t")  # 4 heads
    with pytest.raises(C.ConfigError, match=r"train.mesh_tensor: 8-way sharding over tensor does not divide "
                                            r"\['layers'\]\['attn'\]"):
      train(cfg, progress=False)
  assert os.listdir(tmp_path) == []


def test_a_stop_request_at_any_moment_ends_cleanly(tmp_path):
  """SIGINT while the run starts (imports, data, compilation) or trains: exit 0 (or 130 before
  the trainer runs), one line, no traceback, and no run directory unless a checkpoint is in it."""
  import signal
  import time
  for delay in (2.0, 6.0):
    run_dir = tmp_path / f"after_{delay:g}s"
    process = subprocess.Popen([sys.executable, str(REPO / "train.py"), f"train.run_dir={tmp_path}",
                                f"train.run_name={run_dir.name}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, cwd=tmp_path, env={**os.environ, "XLA_FLAGS": ""})
    time.sleep(delay)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode in (0, 130), stderr
    assert "Traceback" not in stderr and "Segmentation" not in stderr
    assert not run_dir.exists() or has_checkpoint(str(run_dir))


def test_a_ctrl_c_during_an_import_waits_for_the_import_to_finish(tmp_path, monkeypatch):
  """The CI failure this guards against: SIGINT landed while jaxlib's native module was being
  initialised, the KeyboardInterrupt left it half set up, and loading it again aborted the
  process (SIGABRT, absl's "SetTimeZone() has already been called"). A Ctrl-C during an import
  is recorded and raised at the next safe point, after the import; elsewhere, or a second one,
  raises at once."""
  import importlib
  import signal
  from lpcjax import interrupts
  (tmp_path / "ctrl_c_while_loading.py").write_text(
      "import signal\nsignal.raise_signal(signal.SIGINT)\nfinished = True\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  with interrupts.remembered():
    try:
      module = importlib.import_module("ctrl_c_while_loading")
    except KeyboardInterrupt:
      pytest.fail("the Ctrl-C was raised inside the import")
    assert module.finished and interrupts.requested()
    with pytest.raises(KeyboardInterrupt):
      interrupts.raise_if_requested()
    with pytest.raises(KeyboardInterrupt):  # outside an import: at once
      signal.raise_signal(signal.SIGINT)
    (tmp_path / "second_ctrl_c_while_loading.py").write_text("import signal\nsignal.raise_signal(signal.SIGINT)\n")
    with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C: at once, even inside an import
      importlib.import_module("second_ctrl_c_while_loading")
  assert not interrupts.requested()


def test_a_ctrl_c_swallowed_during_start_up_still_stops_the_run(capsys):
  """The CI failure this guards against: SIGINT landed in JAX's garbage-collection callback, Python
  printed 'Exception ignored' with a traceback, and the run trained to the end. Inside
  ``remembered()`` the request is recorded, nothing is printed, and the trainer's stop flag is
  set when it starts; on exit the previous handler is back."""
  import signal
  from lpcjax import interrupts
  from lpcjax.training.loop import stop_requests
  before = signal.getsignal(signal.SIGINT)
  with interrupts.remembered():
    ctrl_c_swallowed_by_the_interpreter()
    assert interrupts.requested()
    with stop_requests() as stop:
      assert stop["stop"]
  assert signal.getsignal(signal.SIGINT) is before
  assert not interrupts.requested()  # the next run in this process is not stopped by it
  err = capsys.readouterr().err
  assert "Traceback" not in err and "Exception ignored" not in err

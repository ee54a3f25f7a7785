import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpcjax import config as C
from lpcjax import models
from lpcjax.losses import masked_cross_entropy
from lpcjax.training import TrainingError, create_train_state, decay_mask, has_checkpoint, train, train_step

from conftest import REPO, tiny_experiment


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
  state = create_train_state(models.get("fox").build(cfg.model), cfg)
  mask = decay_mask(state.params)
  assert mask["embed"]["embedding"] and mask["layers"]["attn"]["q_proj"]["kernel"]
  assert not mask["layers"]["attn"]["forget_gate"]["proj"]["bias"]
  assert not mask["layers"]["attn_norm"]["scale"] and not mask["final_norm"]["scale"]


def test_gradient_accumulation_equals_one_big_batch(tmp_path):
  cfg = tiny_experiment(tmp_path)
  state = create_train_state(models.get("fox").build(cfg.model), cfg)
  rng = np.random.default_rng(0)
  batch = {"inputs": jnp.asarray(rng.integers(0, 64, (8, 32))), "targets": jnp.asarray(rng.integers(0, 64, (8, 32))),
           "loss_mask": jnp.ones((8, 32))}
  one, m1 = jax.jit(train_step)(state, batch)
  four, m4 = jax.jit(train_step, static_argnames="accum_steps")(state, batch, accum_steps=4)
  np.testing.assert_allclose(m1["loss"], m4["loss"], rtol=1e-6)
  for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(four.params)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_nonfinite_loss_skips_the_update(tmp_path):
  cfg = tiny_experiment(tmp_path)
  state = create_train_state(models.get("fox").build(cfg.model), cfg)
  batch = {"inputs": jnp.zeros((8, 32), jnp.int32), "targets": jnp.zeros((8, 32), jnp.int32),
           "loss_mask": jnp.ones((8, 32))}
  nan_loss = lambda apply_fn, params, batch: (jnp.nan * jax.tree.leaves(params)[0].sum(), {"loss": jnp.nan})
  new, metrics = jax.jit(train_step, static_argnames="loss_fn")(state, batch, loss_fn=nan_loss)
  assert float(metrics["finite"]) == 0.0 and int(new.step) == int(state.step)
  for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(state.params)):
    np.testing.assert_array_equal(a, b)


def test_train_writes_a_restorable_run_directory(tmp_path):
  cfg = tiny_experiment(tmp_path)
  run_dir, summary = train(cfg, progress=False, devices=one_device())
  records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
  losses = [r["loss"] for r in records if "loss" in r]
  assert len(losses) == 3 and losses[-1] < losses[0]
  assert summary["eval_tokens"] == 2 * 8 * 4 and not summary["preempted"]
  saved = C.from_dict(json.load(open(os.path.join(run_dir, "config.json"))))
  assert saved == cfg
  with pytest.raises(FileExistsError, match="already holds checkpoints"):
    train(cfg, progress=False, devices=one_device())


def test_train_cli_rejects_bad_input_with_one_line(tmp_path):
  one_device = {**os.environ, "XLA_FLAGS": ""}  # as a user's single-CPU run
  result = subprocess.run([sys.executable, str(REPO / "train.py"), "model.d_modle=3"],
                          capture_output=True, text=True, cwd=tmp_path, env=one_device)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      "error: model.d_modle: unknown key; known keys are " + result.stderr.split("known keys are ")[1].strip()]
  result = subprocess.run([sys.executable, str(REPO / "train.py"), "--config", "fox_tiny_text",
                           "data.train_files=/nonexistent.txt", "data.tokenizer_file=/nonexistent.tiktoken",
                           f"train.run_dir={tmp_path}"],
                          capture_output=True, text=True, cwd=tmp_path, env=one_device)
  assert result.returncode == 2 and "error: tokenizer rank file not found" in result.stderr
  assert "Traceback" not in result.stderr


def test_debug_checks_run_inside_training(tmp_path):
  cfg = tiny_experiment(tmp_path, "model.debug_checks=true", "train.steps=2", "train.warmup_steps=1")
  _, summary = train(cfg, progress=False, devices=one_device())
  assert np.isfinite(summary["eval_loss"])


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

  nan_loss = lambda apply_fn, params, batch: (
      jnp.nan * jax.tree.leaves(params)[0].sum(), {"loss": jnp.nan, "accuracy": 0.0, "count": 1.0})
  if "nan_fox_for_tests" not in models.names():
    models.register(models.Family("nan_fox_for_tests", NaNConfig, models.DecoderLM, loss=nan_loss))
  base = tiny_experiment(tmp_path, "train.max_nonfinite_steps=3", "train.mesh_data=1", name="nan")
  cfg = dataclasses.replace(base, model=NaNConfig(**{f.name: getattr(base.model, f.name)
                                                     for f in dataclasses.fields(base.model)}))
  with pytest.raises(TrainingError, match="3 non-finite losses in a row at step 3; stopped without saving"):
    train(cfg, progress=False, devices=one_device())
  assert not has_checkpoint(os.path.join(tmp_path, "nan"))

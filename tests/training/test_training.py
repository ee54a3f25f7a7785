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
from lpcjax.training import create_train_state, decay_mask, masked_cross_entropy, train
from lpcjax.training.checkpoint import restore_state

from conftest import REPO


def tiny_experiment(tmp_path, *overrides):
  cfg = C.load_experiment(str(REPO / "configs" / "fox_tiny_mqar.py"))
  return C.apply_overrides(cfg, [
      "model.vocab_size=64", "data.mqar_vocab_size=64", "data.seq_len=32", "data.mqar_num_pairs=4",
      "data.batch_size=8", "model.d_model=32", "model.mlp_multiple_of=32", "train.steps=30",
      "train.warmup_steps=5", "train.log_every=10", "train.eval_batches=2",
      f"train.run_dir={tmp_path}", "train.run_name=run", *overrides])


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


def test_train_writes_a_restorable_run_directory(tmp_path):
  cfg = tiny_experiment(tmp_path)
  run_dir, summary = train(cfg, progress=False)
  records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
  losses = [r["loss"] for r in records if "loss" in r]
  assert len(losses) == 3 and losses[-1] < losses[0]
  assert summary["eval_tokens"] == 2 * 8 * 4
  saved = C.from_dict(json.load(open(os.path.join(run_dir, "config.json"))))
  assert saved == cfg
  fresh = create_train_state(models.get("fox").build(saved.model), saved)
  restored = restore_state(run_dir, fresh)
  assert int(restored.step) == 30
  assert not np.allclose(jax.tree.leaves(restored.params)[0], jax.tree.leaves(fresh.params)[0])
  with pytest.raises(FileExistsError, match="already holds checkpoints"):
    train(cfg, progress=False)


def test_train_cli_rejects_bad_input_with_one_line(tmp_path):
  result = subprocess.run([sys.executable, str(REPO / "train.py"), "model.d_modle=3"],
                          capture_output=True, text=True, cwd=tmp_path)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      "error: model.d_modle: unknown key; known keys are " + result.stderr.split("known keys are ")[1].strip()]
  result = subprocess.run([sys.executable, str(REPO / "train.py"), "--config", "fox_tiny_text",
                           "data.train_files=/nonexistent.txt", "data.tokenizer_file=/nonexistent.tiktoken"],
                          capture_output=True, text=True, cwd=tmp_path)
  assert result.returncode == 2 and "error: tokenizer rank file not found" in result.stderr
  assert "Traceback" not in result.stderr


def test_debug_checks_run_inside_training(tmp_path):
  cfg = tiny_experiment(tmp_path, "model.debug_checks=true", "train.steps=2", "train.warmup_steps=1")
  _, summary = train(cfg, progress=False)
  assert np.isfinite(summary["eval_loss"])

"""Sharded training on 8 virtual CPU devices, exact resume, preemption and resharding."""

import json
import os
import signal
import threading
import time

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from lpcjax import config as C
from lpcjax import models
from lpcjax.sharding import make_mesh, rules_from_config
from lpcjax.training import Checkpointer, create_train_state, make_optimizer, state_shardings, train

from conftest import tiny_experiment

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 devices (XLA_FLAGS)")
MESH_2X2X2 = ("train.mesh_data=2", "train.mesh_fsdp=2", "train.mesh_tensor=2")


def losses_of(run_dir):
  return [r["loss"] for r in map(json.loads, open(os.path.join(run_dir, "metrics.jsonl"))) if "loss" in r]


def final_params(run_dir, cfg):
  model = models.get(cfg.model.family).build(cfg.model)
  state = create_train_state(model, cfg)
  checkpointer = Checkpointer(run_dir)
  restored = checkpointer.restore(state, jax.tree.map(lambda x: x.sharding, state))
  checkpointer.close()
  return restored.params


def test_params_are_sharded_by_the_rules(tmp_path):
  cfg = tiny_experiment(tmp_path, *MESH_2X2X2, "model.block=pro")
  mesh = make_mesh(cfg.train)
  model = models.get("fox").build(cfg.model)
  optimizer = make_optimizer(cfg.train)
  _, shardings = state_shardings(model, cfg, optimizer, mesh, rules_from_config(cfg.train))
  state = create_train_state(model, cfg, optimizer, shardings)
  kernel = state.params["layers"]["mlp"]["w_gate"]["kernel"]  # ('layers', 'embed', 'mlp')
  assert kernel.sharding.spec == P(None, "fsdp", "tensor")
  shard_shape = (2, 32 // 2, cfg.model.mlp_hidden_size // 2)  # embed over fsdp, mlp over tensor
  assert len(kernel.addressable_shards) == 8 and kernel.addressable_shards[0].data.shape == shard_shape
  mu = state.opt_state[1][0].mu["layers"]["mlp"]["w_gate"]["kernel"]
  assert mu.sharding.spec == P(None, "fsdp", "tensor")


def test_mesh_and_single_device_give_the_same_losses(tmp_path):
  common = ("train.steps=10", "train.log_every=1", "train.eval_batches=1")
  one, _ = train(tiny_experiment(tmp_path, *common, "train.mesh_data=1", name="one"), progress=False,
                 devices=jax.devices()[:1])
  eight, summary = train(tiny_experiment(tmp_path, *common, *MESH_2X2X2, name="eight"), progress=False)
  assert summary["mesh"] == {"data": 2, "fsdp": 2, "tensor": 2}
  np.testing.assert_allclose(losses_of(eight), losses_of(one), rtol=2e-5)  # reduction order differs


def test_resume_is_exact_and_survives_sigterm(tmp_path):
  common = ("train.steps=24", "train.log_every=1", "train.eval_batches=1", "train.mesh_data=1")
  devices = jax.devices()[:1]
  straight_dir, _ = train(tiny_experiment(tmp_path, *common, name="straight"), progress=False, devices=devices)

  cfg = tiny_experiment(tmp_path, *common, name="stopped")
  metrics = os.path.join(tmp_path, "stopped", "metrics.jsonl")

  def preempt_after_first_steps():
    while not (os.path.exists(metrics) and len(open(metrics).readlines()) >= 3):
      time.sleep(0.02)
    os.kill(os.getpid(), signal.SIGTERM)

  threading.Thread(target=preempt_after_first_steps, daemon=True).start()
  stopped_dir, summary = train(cfg, progress=False, devices=devices)
  assert summary["preempted"] and 3 <= summary["step"] < 24
  _, summary = train(cfg, resume=True, progress=False, devices=devices)
  assert not summary["preempted"]
  assert losses_of(stopped_dir) == losses_of(straight_dir)  # bitwise, step for step
  for a, b in zip(jax.tree.leaves(final_params(stopped_dir, cfg)), jax.tree.leaves(final_params(straight_dir, cfg))):
    np.testing.assert_array_equal(a, b)


def test_resume_on_another_mesh_reshards(tmp_path):
  first = tiny_experiment(tmp_path, "train.steps=8", "train.checkpoint_every=4", *MESH_2X2X2, name="r")
  train(first, progress=False)
  second = C.apply_overrides(first, ["train.steps=12", "train.mesh_data=4", "train.mesh_fsdp=1"])
  run_dir, summary = train(second, resume=True, progress=False)
  assert summary["mesh"] == {"data": 4, "fsdp": 1, "tensor": 2} and summary["step"] == 12
  assert [r["step"] for r in map(json.loads, open(os.path.join(run_dir, "metrics.jsonl"))) if "loss" in r][-1] == 12


def test_bad_resume_and_mesh_inputs(tmp_path):
  cfg = tiny_experiment(tmp_path, "train.steps=2", "train.warmup_steps=1", "train.mesh_data=1", name="b")
  train(cfg, progress=False, devices=jax.devices()[:1])
  changed = C.apply_overrides(cfg, ["model.d_model=64"])
  with pytest.raises(C.ConfigError, match="model.d_model: the checkpoint .* was trained with 32"):
    train(changed, resume=True, progress=False, devices=jax.devices()[:1])
  uneven = tiny_experiment(tmp_path, "data.batch_size=6", *MESH_2X2X2, name="u")
  with pytest.raises(C.ConfigError, match="data.batch_size: 6 is not divisible by the data axes"):
    train(uneven, progress=False)
  with pytest.raises(ValueError, match="needs 12 devices"):
    make_mesh(C.apply_overrides(cfg, ["train.mesh_data=3", "train.mesh_fsdp=2", "train.mesh_tensor=2"]).train)

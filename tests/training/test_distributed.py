"""Sharded training on 8 virtual CPU devices, exact resume, preemption and resharding."""

import functools
import json
import os
import re
import shutil

import flax.linen as nn
import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from lpcjax import experiment as C
from lpcjax import models
from lpcjax.models import decoder
from lpcjax.sharding import make_mesh, rules_from_config
from lpcjax.training import Checkpointer, create_train_state, make_optimizer, state_shardings, train, train_step

from conftest import sigterm_after_rows, tiny_experiment, write_token_file

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 devices (XLA_FLAGS)")
MESH_2X2X2 = ("train.mesh_data=2", "train.mesh_fsdp=2", "train.mesh_tensor=2")


def losses_of(run_dir):
  return [r["loss"] for r in map(json.loads, open(os.path.join(run_dir, "metrics.jsonl"))) if "loss" in r]


def final_params(run_dir, cfg):
  family = models.get(cfg.model.family)
  state = create_train_state(family, family.build(cfg.model), cfg)
  checkpointer = Checkpointer(run_dir)
  try:  # closed even when the restore fails: no Orbax threads left for the next test
    return checkpointer.restore(state, jax.tree.map(lambda x: x.sharding, state)).params
  finally:
    checkpointer.close()


def test_params_are_sharded_by_the_rules(tmp_path):
  cfg = tiny_experiment(tmp_path, *MESH_2X2X2, "model.block=pro")
  mesh = make_mesh(cfg.train)
  model = models.get("fox").build(cfg.model)
  optimizer = make_optimizer(cfg.train)
  _, shardings = state_shardings(models.get("fox"), model, cfg, optimizer, mesh, rules_from_config(cfg.train))
  state = create_train_state(models.get("fox"), model, cfg, optimizer, shardings)
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
  assert summary["mesh"] == {"data": 2, "fsdp": 2, "context": 1, "tensor": 2}
  np.testing.assert_allclose(losses_of(eight), losses_of(one), rtol=2e-5)  # reduction order differs


def test_resume_is_exact_and_survives_sigterm(tmp_path):
  common = ("train.steps=24", "train.log_every=1", "train.eval_batches=1", "train.mesh_data=1")
  devices = jax.devices()[:1]
  straight_dir, _ = train(tiny_experiment(tmp_path, *common, name="straight"), progress=False, devices=devices)

  cfg = tiny_experiment(tmp_path, *common, name="stopped")
  with pytest.MonkeyPatch.context() as patch:
    sigterm_after_rows(patch, rows=3)
    stopped_dir, summary = train(cfg, progress=False, devices=devices)
  assert summary["preempted"] and summary["step"] == 3
  _, summary = train(cfg, resume=True, progress=False, devices=devices)
  assert not summary["preempted"]
  assert losses_of(stopped_dir) == losses_of(straight_dir)  # bitwise, step for step
  for a, b in zip(jax.tree.leaves(final_params(stopped_dir, cfg)), jax.tree.leaves(final_params(straight_dir, cfg))):
    np.testing.assert_array_equal(a, b)


def test_resume_on_another_mesh_reshards(tmp_path):
  """Stop at step 4 on a 2x2x2 mesh, resume on 4x1x2: the restored state is the saved one, and
  the losses and final params follow the uninterrupted 2x2x2 run (up to reduction order)."""
  common = ("train.steps=8", "train.log_every=1", "train.eval_batches=1", *MESH_2X2X2)
  straight_dir, _ = train(tiny_experiment(tmp_path, *common, name="straight"), progress=False)
  first = tiny_experiment(tmp_path, *common, "train.checkpoint_every=4", name="r")
  run_dir, _ = train(first, progress=False)
  interrupt_at(run_dir, 4)
  saved = final_params(run_dir, first)
  second = C.apply_overrides(first, ["train.mesh_data=4", "train.mesh_fsdp=1"])
  mesh = make_mesh(second.train)
  model = models.get("fox").build(second.model)
  with jax.set_mesh(mesh):
    abstract, shardings = state_shardings(models.get("fox"), model, second, make_optimizer(second.train), mesh,
                                          rules_from_config(second.train))
    checkpointer = Checkpointer(run_dir)
    try:
      restored = checkpointer.restore(abstract, shardings, step=4)
    finally:
      checkpointer.close()
  kernel = restored.params["layers"]["mlp"]["w_gate"]["kernel"]
  assert kernel.sharding.spec == P(None, "fsdp", "tensor") and dict(kernel.sharding.mesh.shape)["data"] == 4
  for a, b in zip(jax.tree.leaves(restored.params), jax.tree.leaves(saved)):
    np.testing.assert_array_equal(a, b)
  _, summary = train(second, resume=True, progress=False)
  assert summary["mesh"] == {"data": 4, "fsdp": 1, "context": 1, "tensor": 2} and summary["step"] == 8
  np.testing.assert_allclose(losses_of(run_dir), losses_of(straight_dir), rtol=2e-5)
  for a, b in zip(jax.tree.leaves(final_params(run_dir, first)), jax.tree.leaves(final_params(straight_dir, first))):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_accumulation_step_moves_no_data(tmp_path):
  """Micro-batching a data-sharded batch adds no all-gather, collective-permute or all-to-all to
  the compiled step (the FSDP parameter gathers are the same with and without accumulation)."""
  counts = {}
  for steps in (1, 4):
    cfg = tiny_experiment(tmp_path, "train.mesh_data=4", "train.mesh_fsdp=2", "data.batch_size=32",
                          f"train.grad_accum_steps={steps}")
    family = models.get("fox")
    model = family.build(cfg.model)
    mesh = make_mesh(cfg.train)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules_from_config(cfg.train)):
      optimizer = make_optimizer(cfg.train)
      _, shardings = state_shardings(family, model, cfg, optimizer, mesh, rules_from_config(cfg.train))
      state = create_train_state(family, model, cfg, optimizer, shardings)
      data_sharding = NamedSharding(mesh, P(("data", "fsdp")))
      batch = {k: jax.device_put(np.zeros((32, 32), dtype), data_sharding)
               for k, dtype in (("inputs", np.int32), ("targets", np.int32), ("loss_mask", np.float32))}
      step = functools.partial(train_step, accum_steps=steps)
      hlo = jax.jit(step).lower(state, batch).compile().as_text()
    counts[steps] = {op: len(re.findall(rf"= \S+ {op}(?:-start)?\(", hlo))
                     for op in ("all-gather", "collective-permute", "all-to-all")}
  assert counts[1]["all-gather"] > 0  # the count sees collectives at all (FSDP gathers the params)
  assert counts[4] == counts[1], counts


def interrupt_at(run_dir, step):
  """Make a finished run look interrupted right after its checkpoint ``step``: later checkpoints
  and metrics rows go (what a run killed just after saving ``step`` leaves behind)."""
  for name in os.listdir(os.path.join(run_dir, "checkpoints")):
    if name.isdigit() and int(name) > step:
      shutil.rmtree(os.path.join(run_dir, "checkpoints", name))
  metrics = os.path.join(run_dir, "metrics.jsonl")
  rows = [line for line in open(metrics) if json.loads(line)["step"] <= step and "loss" in json.loads(line)]
  open(metrics, "w").writelines(rows)


@pytest.mark.parametrize("source", ["mqar", "tokens"])
def test_resume_with_accumulation_on_a_mesh_is_exact(tmp_path, source):
  """Bitwise resume on a 4x2 mesh with 2 micro-batches per step; with a token file of 40 windows
  (batch 16), step 3 crosses the first epoch boundary of the shuffle, and the run resumes there."""
  common = ["train.steps=6", "train.log_every=1", "train.eval_batches=1", "train.grad_accum_steps=2",
            "data.batch_size=16", "train.mesh_data=4", "train.mesh_fsdp=2", "train.checkpoint_every=3"]
  if source == "tokens":
    prefix = write_token_file(tmp_path / "tokens", num_tokens=40 * 32 + 1)
    common += ["data.kind=tokens", f"data.train_tokens={prefix}", "model.vocab_size=50257"]
  straight_dir, _ = train(tiny_experiment(tmp_path, *common, name="straight"), progress=False)
  cfg = tiny_experiment(tmp_path, *common, name="split")
  split_dir, _ = train(cfg, progress=False)
  interrupt_at(split_dir, 3)
  train(cfg, resume=True, progress=False)
  assert losses_of(split_dir) == losses_of(straight_dir) and len(losses_of(straight_dir)) == 6
  for a, b in zip(jax.tree.leaves(final_params(split_dir, cfg)), jax.tree.leaves(final_params(straight_dir, cfg))):
    np.testing.assert_array_equal(a, b)


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


def test_no_involuntary_rematerialization_on_a_2x2x2_mesh(tmp_path, capfd, monkeypatch, no_persistent_cache):
  """XLA warns "Involuntary full rematerialization" when a sharding constraint disagrees with a
  layer's layout (it was the FSDP-sharded embedding table's lookup). The control with the plain
  flax nn.Embed shows that the check sees the warning.

  In this process (it was two train-step compiles in subprocesses: 28 s, of which 12 s starting
  Python and JAX): XLA logs to file descriptor 2, which capfd reads. The persistent cache is off,
  as a cache hit would skip the compile and with it the warning."""
  def warnings(*overrides):
    cfg = tiny_experiment(tmp_path, *MESH_2X2X2, "data.batch_size=16", *overrides)
    family = models.get(cfg.model.family)
    model = family.build(cfg.model)
    mesh, rules = make_mesh(cfg.train), rules_from_config(cfg.train)
    capfd.readouterr()  # from here: the state's and the step's compiles
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      optimizer = make_optimizer(cfg.train)
      _, shardings = state_shardings(family, model, cfg, optimizer, mesh, rules)
      state = create_train_state(family, model, cfg, optimizer, shardings)
      batch = {k: jax.device_put(np.zeros((16, 32), dtype), NamedSharding(mesh, P(("data", "fsdp"))))
               for k, dtype in (("inputs", np.int32), ("targets", np.int32), ("loss_mask", np.float32))}
      jax.jit(train_step).lower(state, batch).compile()
    return capfd.readouterr().err.count("Involuntary full rematerialization")

  assert warnings("model.block=pro", "model.tie_embeddings=false") == 0
  monkeypatch.setattr(decoder, "TokenEmbed", nn.Embed)
  assert warnings() > 0

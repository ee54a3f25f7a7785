"""Training with the sequence sharded over the mesh's "context" axis (train.mesh_context): the
FoX models equal their one-device run, the trainer's losses match, checkpoints resume bitwise
onto the same mesh and carry on without the axis, and the compiled step moves keys only by
collective-permute."""

import functools
import json
import os
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpcjax import experiment as C
from lpcjax import models
from lpcjax.sharding import make_mesh, rules_from_config
from lpcjax.training import create_train_state, make_optimizer, state_shardings, train, train_step
from lpcjax.training.loop import TrainingData

from conftest import tiny_experiment, write_token_file
from test_distributed import final_params, interrupt_at, losses_of

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 devices (XLA_FLAGS)")
DATA2_CONTEXT4 = ("train.mesh_data=2", "train.mesh_context=4")
FSDP2_CONTEXT2_TENSOR2 = ("train.mesh_data=1", "train.mesh_fsdp=2", "train.mesh_context=2", "train.mesh_tensor=2")


@pytest.mark.parametrize("family,block,mesh,window", [
    ("fox", "llama", DATA2_CONTEXT4, None), ("fox", "pro", DATA2_CONTEXT4, None),
    ("transformer", "llama", DATA2_CONTEXT4, None), ("fox", "pro", FSDP2_CONTEXT2_TENSOR2, None),
    ("fox", "llama", DATA2_CONTEXT4, 12)])
def test_model_on_a_context_mesh_equals_one_device(family, block, mesh, window):
  """Logits and every parameter gradient on a (data 2, context 4) mesh, and beside FSDP and
  tensor parallelism, with packed documents that cross the shard boundaries: the Pro block's
  KV-shift and the Transformer's RoPE positions (counted from each document's start) cross
  them too; with a 12-token window over 8-token shards the ring visits two shards back."""
  config_cls = models.get(family).config_cls
  cfg = config_cls(vocab_size=50, d_model=32, num_layers=2, num_heads=4, mlp_multiple_of=32, block=block,
                   attention_impl="xla", attention_window=window)
  model = models.get(family).build(cfg)
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, 50, size=(4, 32)))
  segments = jnp.asarray(np.cumsum(rng.random((4, 32)) < 0.1, axis=1), jnp.int32)
  weights = jnp.asarray(rng.normal(size=(4, 32, 50)), jnp.float32)
  params = model.init(jax.random.PRNGKey(0), tokens)

  def value_and_grad(params):
    loss = lambda p: jnp.sum(model.apply(p, tokens, segment_ids=segments) * weights)
    return jax.jit(jax.value_and_grad(loss))(params)

  expected = value_and_grad(params)
  mesh = make_mesh(tiny_experiment("/tmp", *mesh).train)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules_from_config(tiny_experiment("/tmp").train)):
    got = value_and_grad(params)
    logits = jax.jit(lambda p: model.apply(p, tokens, segment_ids=segments))(params)
  np.testing.assert_allclose(logits, model.apply(params, tokens, segment_ids=segments), atol=2e-5)
  np.testing.assert_allclose(got[0], expected[0], rtol=1e-5)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got[1]), jax.tree.leaves(expected[1])):
    np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4, err_msg=jax.tree_util.keystr(path))


def test_training_matches_and_resumes_across_meshes(tmp_path):
  """Losses of mesh_context=4 follow mesh_context=1 (rtol 2e-5: the reductions' order differs);
  a run stopped at step 4 resumes bitwise on its mesh, and a copy continues on a mesh without a
  context axis (data 8)."""
  common = ("train.steps=8", "train.log_every=1", "train.eval_batches=1", "train.checkpoint_every=4",
            "model.block=pro")
  plain_dir, _ = train(tiny_experiment(tmp_path, *common, "train.mesh_data=8", name="plain"), progress=False)
  cfg = tiny_experiment(tmp_path, *common, *DATA2_CONTEXT4, name="context")
  context_dir, summary = train(cfg, progress=False)
  assert summary["mesh"] == {"data": 2, "fsdp": 1, "context": 4, "tensor": 1}
  np.testing.assert_allclose(losses_of(context_dir), losses_of(plain_dir), rtol=2e-5)
  straight = losses_of(context_dir)

  interrupt_at(context_dir, 4)
  train(cfg, resume=True, progress=False)
  assert losses_of(context_dir) == straight  # bitwise, step for step
  resumed = final_params(context_dir, cfg)

  interrupt_at(context_dir, 4)
  elsewhere = C.apply_overrides(cfg, ["train.mesh_data=8", "train.mesh_context=1"])
  _, summary = train(elsewhere, resume=True, progress=False)
  assert summary["mesh"]["context"] == 1 and summary["step"] == 8
  np.testing.assert_allclose(losses_of(context_dir), straight, rtol=2e-5)
  for a, b in zip(jax.tree.leaves(final_params(context_dir, cfg)), jax.tree.leaves(resumed)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def compiled_step_text(cfg):
  family = models.get(cfg.model.family)
  model, mesh, rules = family.build(cfg.model), make_mesh(cfg.train), rules_from_config(cfg.train)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    optimizer = make_optimizer(cfg.train)
    _, shardings = state_shardings(family, model, cfg, optimizer, mesh, rules)
    state = create_train_state(family, model, cfg, optimizer, shardings)
    data = TrainingData(cfg, mesh)
    batch = data.place(next(data.train))
    assert batch["inputs"].sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp"), "context")
    step = jax.jit(functools.partial(train_step, loss_fn=family.loss, accum_steps=1, seed=0))
    return step.lower(state, batch).compile().as_text()


def collectives(hlo, op):
  return [line for line in hlo.splitlines() if re.search(rf"= .*\b{op}(-start)?\(", line)]


@pytest.mark.parametrize("model", [("model.block=pro",), ("model.family=transformer",)])
def test_compiled_step_moves_the_sequence_only_by_collective_permute(tmp_path, model):
  """A step on packed token windows (segment ids) over (data 2, context 4), for a Pro-block FoX
  (KV-shift) and a Transformer (RoPE positions within each document): keys and the KV-shift's
  boundary token travel by collective-permute; no all-to-all, and every all-gather is of
  per-shard totals ([shards, batch(, heads)]), none of a sequence (48 tokens, 12 per shard)."""
  num_tokens = 20 * 49 + 1
  prefix = write_token_file(tmp_path / "tokens", num_tokens=num_tokens)
  with open(f"{prefix}.json") as f:
    meta = json.load(f)
  meta["doc_starts"] = list(range(0, num_tokens, 29))  # documents that straddle the shards
  meta["num_documents"] = len(meta["doc_starts"])
  with open(f"{prefix}.json", "w") as f:
    json.dump(meta, f)
  cfg = tiny_experiment(tmp_path, *DATA2_CONTEXT4, "data.seq_len=48", *model, "data.kind=tokens",
                        f"data.train_tokens={prefix}", "model.vocab_size=50257", "data.segment_ids=true")
  hlo = compiled_step_text(cfg)
  assert len(collectives(hlo, "collective-permute")) >= 8
  assert not collectives(hlo, "all-to-all")
  for line in collectives(hlo, "all-gather"):
    shape = re.search(r"= \(?\w+\[([\d,]+)\]", line).group(1).split(",")
    assert shape[0] == "4" and "48" not in shape and "12" not in shape, line


def test_families_and_lengths_that_cannot_shard_their_sequence_say_so(tmp_path):
  lpcsm = C.apply_overrides(C.load_experiment("lpcsm:tiny"), [*DATA2_CONTEXT4, f"train.run_dir={tmp_path}"])
  with pytest.raises(C.ConfigError, match=r"^train.mesh_context: the lpcsm family cannot shard its sequence "
                                          r"\(a recurrence runs along it; families that can: .*fox.*\)"):
    train(lpcsm, progress=False)
  odd = tiny_experiment(tmp_path, *DATA2_CONTEXT4, "data.seq_len=36")
  with pytest.raises(C.ConfigError, match="needs data.seq_len to be a multiple of 8, got 36"):
    train(odd, progress=False)
  assert not os.listdir(tmp_path)  # nothing written
  assert json.dumps(C.to_dict(odd)["train"]["mesh_context"]) == "4"


def test_a_context_group_spanning_hosts_is_refused(tmp_path):
  """Each process reads whole sequences, so a context group must not span processes (checked
  on a stand-in mesh whose devices claim two processes: one CPU process cannot have two)."""
  from lpcjax.training.loop import check_context_parallel
  cfg = tiny_experiment(tmp_path, *DATA2_CONTEXT4)
  real = make_mesh(cfg.train)
  host = lambda index: type("Device", (), {"process_index": index})()
  by_data = np.array([[[[host(0)]] * 4], [[[host(1)]] * 4]], dtype=object)  # [data 2, fsdp 1, context 4, tensor 1]
  by_context = np.array([[[[host(i // 2)] for i in range(4)]]] * 2, dtype=object)
  stand_in = lambda devices: type("Mesh", (), {"devices": devices, "axis_names": real.axis_names,
                                               "shape": real.shape})()
  check_context_parallel(models.get("fox"), cfg, stand_in(by_data))  # hosts split the data axis: fine
  with pytest.raises(C.ConfigError, match="the 4 devices of a context group must be on one host"):
    check_context_parallel(models.get("fox"), cfg, stand_in(by_context))

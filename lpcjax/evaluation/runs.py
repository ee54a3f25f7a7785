"""Rebuild a trained model from its run directory alone (config.json + the latest checkpoint)."""

import dataclasses
import json
import os

import flax.linen as nn
import jax

from lpcjax import config as config_lib
from lpcjax import models
from lpcjax.sharding import make_mesh, rules_from_config
from lpcjax.training.checkpoint import Checkpointer, has_checkpoint
from lpcjax.training.steps import make_optimizer, state_shardings


class RunError(ValueError):
  """A run directory that cannot be evaluated."""


def load_run(run_dir, mesh=None):
  """(config, model, params, mesh, rules). Params are restored sharded by the run's logical
  rules onto ``mesh`` (default: every local device on the data axis)."""
  config_path = os.path.join(run_dir, "config.json")
  if not os.path.isfile(config_path):
    raise RunError(f"{run_dir}: no config.json, not a run directory")
  if not has_checkpoint(run_dir):
    raise RunError(f"{run_dir}: no checkpoint to evaluate (has the run saved one?)")
  with open(config_path) as f:
    config = config_lib.from_dict(json.load(f))
  model = models.get(config.model.family).build(config.model)
  if mesh is None:
    mesh = make_mesh(dataclasses.replace(config.train, mesh_data=-1, mesh_fsdp=1, mesh_tensor=1))
  rules = rules_from_config(config.train)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    optimizer = make_optimizer(config.train)
    abstract, shardings = state_shardings(model, config, optimizer, mesh, rules)
    checkpointer = Checkpointer(run_dir)
    state = checkpointer.restore(abstract, shardings)
    checkpointer.close()
  return config, model, state.params, mesh, rules

"""Compile one training step on a 2 x 2 x 2 (data, fsdp, tensor) mesh of 8 virtual CPU devices
and let XLA print what it prints (tests/training/test_distributed.py reads its stderr).

  python remat_check.py [--plain-embed] OVERRIDES...   # --plain-embed: the flax nn.Embed, as a control
"""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from conftest import tiny_experiment  # noqa: E402
from lpcjax import models  # noqa: E402
from lpcjax.models import decoder  # noqa: E402
from lpcjax.sharding import make_mesh, rules_from_config  # noqa: E402
from lpcjax.training import create_train_state, make_optimizer, state_shardings, train_step  # noqa: E402

args = sys.argv[1:]
if "--plain-embed" in args:
  args.remove("--plain-embed")
  decoder.TokenEmbed = nn.Embed
cfg = tiny_experiment("/tmp", "train.mesh_data=2", "train.mesh_fsdp=2", "train.mesh_tensor=2", "data.batch_size=16",
                      *args)
family = models.get(cfg.model.family)
model = family.build(cfg.model)
mesh, rules = make_mesh(cfg.train), rules_from_config(cfg.train)
with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
  optimizer = make_optimizer(cfg.train)
  _, shardings = state_shardings(family, model, cfg, optimizer, mesh, rules)
  state = create_train_state(family, model, cfg, optimizer, shardings)
  batch = {k: jax.device_put(np.zeros((16, 32), dtype), NamedSharding(mesh, P(("data", "fsdp"))))
           for k, dtype in (("inputs", np.int32), ("targets", np.int32), ("loss_mask", np.float32))}
  jax.jit(train_step).lower(state, batch).compile()
print("compiled")

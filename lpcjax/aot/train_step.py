"""The trainer's training step compiled for a chip that is absent.

The same pieces as a real run (``lpcjax.training.loop.train``): the family's model and loss,
the config's mesh over the target's compile-only devices, the sharding rules, the optimizer and
its state shardings, the attention backend; only the step is compiled, never run, and nothing
is written anywhere. The batch is the data pipeline's own example shape (one example of the
config's data source; a window of zeros where a token file is not here), batch_size of them,
placed as the trainer places them.
"""

import flax.linen as nn
import jax
import numpy as np

from lpcjax.data import DataError, TokenWindowConfig, TokenWindowSource, make_source
from lpcjax.kernels.target import building_for
from lpcjax.sharding import check_divisible
from lpcjax.training.loop import batch_sharding, check_batch, compiled_steps, model_and_mesh
from lpcjax.training.steps import make_optimizer, state_shardings

from .targets import COMPILER_OPTIONS, no_compilation_cache


def one_example(config):
  """One example of the config's data source, as a run reads it. A token-window kind whose files
  are not here (compiling on a laptop for a cluster's data) gives a window of zeros of its shape
  instead: the same keys, dtypes and length, which is all a compile reads."""
  try:
    return make_source(config.data, config.train.seed, "train")[0]
  except DataError:
    if not isinstance(config.data, TokenWindowConfig):
      raise
    zeros = np.zeros(config.data.seq_len + 1, np.int32)
    return TokenWindowSource(zeros, [0], config.data.seq_len, config.data.segment_ids)[0]


def abstract_batch(config, mesh):
  """One global batch as ShapeDtypeStructs in the trainer's shardings: ``data.batch_size``
  examples of the data source's shape."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct((config.data.batch_size, *x.shape), x.dtype,
                                                     sharding=batch_sharding(mesh, x.ndim + 1)), one_example(config))


def compile_train_step(config, devices, compiler_options=None):
  """The jitted training step of ``config`` (an ExperimentConfig) lowered and compiled for
  ``devices`` (``targets.compile_only_devices``); a ``jax.stages.Compiled``."""
  return compile_lowered(lowered_train_step(config, devices)[0], compiler_options)


def compile_lowered(lowered, compiler_options=None):
  """``lowered.compile`` for a target: XLA's optimization level said, no persistent cache."""
  with no_compilation_cache():
    return lowered.compile({**COMPILER_OPTIONS, **(compiler_options or {})})


def lowered_train_step(config, devices):
  """(the training step of ``config`` lowered for ``devices``, the abstract TrainState and batch
  it was lowered for, with their shardings, the family, the mesh)."""
  family, model, mesh, rules = model_and_mesh(config, devices)
  check_batch(config, mesh)  # as the trainer's data does, before anything is traced
  # The target's devices are the mesh and the default device only for the trace, lowering and
  # compile (Pallas on Triton reads the GPU there): what runs eagerly before (optax initialising
  # the abstract state) cannot run on devices that are not here. Until then the mesh is abstract.
  with nn.logical_axis_rules(rules), building_for(devices[0]):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      optimizer = make_optimizer(config.train)
      abstract, shardings = state_shardings(family, model, config, optimizer, mesh, rules)
    check_divisible(abstract.params, shardings.params)
    state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings)
    step, _ = compiled_steps(family, config, shardings)
    batch = abstract_batch(config, mesh)
    with jax.set_mesh(mesh), jax.default_device(devices[0]):
      lowered = step.trace(state, batch).lower()
  return lowered, state, batch, family, mesh

"""Evaluation's device memory: what ``load_run`` restores, and the evaluation forward's own.

  python benchmarks/eval_memory.py                                  # paper:fox_125m, 1 x 16384 tokens
  python benchmarks/eval_memory.py --config paper:fox_760m --eval-len 4096

Abstract (nothing is materialized, so a CPU measures a GPU-sized run): the bytes a restore puts
on the device, before (the whole TrainState: params, Adam's two moments, the step) and after
(params and mutable collections only, ``Checkpointer.restore_variables``), and XLA's memory
analysis of the compiled per-token forward (``sequence_logits``) of one evaluation batch:
arguments (the params), temporaries and output (the logits). The peak of an evaluation is the
larger of the restore and the forward (the restored TrainState was dropped before the forward).
"""

import argparse
import os

import flax.linen as nn
import jax
import jax.numpy as jnp

from lpcjax import experiment, models
from lpcjax.evaluation.per_token import sequence_logits
from lpcjax.sharding import make_mesh, rules_from_config
from lpcjax.training.steps import make_optimizer, state_shardings, variable_shardings

from results_file import write_results

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
GIB = 2**30


def tree_bytes(tree):
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="paper:fox_125m")
  parser.add_argument("--eval-len", type=int, default=None, help="default: the config's data.seq_len")
  parser.add_argument("--batch-size", type=int, default=1)
  parser.add_argument("--out", default=None)
  args = parser.parse_args()

  config = experiment.load_experiment(args.config, CONFIG_DIR)
  family = models.get(config.model.family)
  model = family.build(config.model)
  mesh = make_mesh(config.train, jax.devices()[:1])
  rules = rules_from_config(config.train)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    state, _ = state_shardings(family, model, config, make_optimizer(config.train), mesh, rules)
    (params, mutable), _ = variable_shardings(family, model, config, mesh, rules)
    length = args.eval_len or config.data.seq_len
    tokens = jax.ShapeDtypeStruct((args.batch_size, length), jnp.int32)
    forward = jax.jit(lambda p, x: sequence_logits(model, p, x)).lower(params, tokens).compile()
  analysis = forward.memory_analysis()
  forward_bytes = (analysis.argument_size_in_bytes + analysis.temp_size_in_bytes
                   + analysis.output_size_in_bytes - analysis.alias_size_in_bytes)
  before, after = tree_bytes(state), tree_bytes((params, mutable))
  figures = {
      "config": args.config, "eval_tokens": [args.batch_size, length],
      "params_gib": tree_bytes(params) / GIB, "optimizer_state_gib": tree_bytes(state.opt_state) / GIB,
      "restored_before_gib": before / GIB, "restored_after_gib": after / GIB,
      "forward_argument_gib": analysis.argument_size_in_bytes / GIB,
      "forward_temp_gib": analysis.temp_size_in_bytes / GIB,
      "forward_output_gib": analysis.output_size_in_bytes / GIB,
      "peak_before_gib": max(before, forward_bytes) / GIB, "peak_after_gib": max(after, forward_bytes) / GIB,
  }
  for name, value in figures.items():
    print(f"{name}: {value:.3f}" if isinstance(value, float) else f"{name}: {value}")
  write_results("eval_memory", figures, args.out)


if __name__ == "__main__":
  main()

"""The param trees' paths, shapes and logical axis names are fixed: checkpoints and the
checkpoint converters address weights by them. The expected lists below were taken from the
models before their layers took typed configs; a change here breaks every saved run."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from lpcjax import models
from lpcjax.models.lpcsm import LPCSMConfig

SMALL = dict(vocab_size=32, d_model=16, num_layers=2, num_heads=4, mlp_multiple_of=16)

LLAMA = {
    "embed/embedding": ((32, 16), ("vocab", "embed")),
    "final_norm/scale": ((16,), ("embed",)),
    "layers/attn/k_proj/kernel": ((2, 16, 4, 4), ("layers", "embed", "heads", "head_dim")),
    "layers/attn/o_proj/kernel": ((2, 4, 4, 16), ("layers", "heads", "head_dim", "embed")),
    "layers/attn/q_proj/kernel": ((2, 16, 4, 4), ("layers", "embed", "heads", "head_dim")),
    "layers/attn/v_proj/kernel": ((2, 16, 4, 4), ("layers", "embed", "heads", "head_dim")),
    "layers/attn_norm/scale": ((2, 16), ("layers", "embed")),
    "layers/mlp/w_gate/kernel": ((2, 16, 48), ("layers", "embed", "mlp")),
    "layers/mlp/w_out/kernel": ((2, 48, 16), ("layers", "mlp", "embed")),
    "layers/mlp/w_up/kernel": ((2, 16, 48), ("layers", "embed", "mlp")),
    "layers/mlp_norm/scale": ((2, 16), ("layers", "embed")),
    "lm_head/kernel": ((16, 32), ("embed", "vocab")),
}
PRO = {  # the Pro block's parts, on top of LLAMA (the MLP width is 48 at both ratios here)
    "layers/attn/g_proj/kernel": ((2, 16, 4, 4), ("layers", "embed", "heads", "head_dim")),
    "layers/attn/k_norm/scale": ((2, 4), ("layers", "head_dim")),
    "layers/attn/k_shift/gate/kernel": ((2, 16, 4), ("layers", "embed", "heads")),
    "layers/attn/o_norm/scale": ((2, 4, 4), ("layers", "heads", "head_dim")),
    "layers/attn/q_norm/scale": ((2, 4), ("layers", "head_dim")),
    "layers/attn/v_shift/gate/kernel": ((2, 16, 4), ("layers", "embed", "heads")),
}
DATA_DEPENDENT_GATE = {
    "layers/attn/forget_gate/proj/bias": ((2, 4), ("layers", "heads")),
    "layers/attn/forget_gate/proj/kernel": ((2, 16, 4), ("layers", "embed", "heads")),
}
DATA_INDEPENDENT_GATE = {"layers/attn/forget_gate/bias": ((2, 4), ("layers", "heads"))}

CASES = {
    "transformer llama": ("transformer", dict(), LLAMA),
    "transformer pro": ("transformer", dict(block="pro"), {**LLAMA, **PRO}),
    "fox llama": ("fox", dict(), {**LLAMA, **DATA_DEPENDENT_GATE}),
    "fox pro": ("fox", dict(block="pro"), {**LLAMA, **PRO, **DATA_DEPENDENT_GATE}),
    "fox data_independent": ("fox", dict(forget_gate="data_independent"), {**LLAMA, **DATA_INDEPENDENT_GATE}),
    "fox fixed": ("fox", dict(forget_gate="fixed"), LLAMA),  # the fixed gate has no params
}


def param_tree(family, config):
  """{"a/b/c": (shape, logical axis names)} of the model's params, from shapes only."""
  model = models.get(family).build(config)
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32)))["params"]
  leaves = jax.tree_util.tree_flatten_with_path(shapes, is_leaf=lambda x: isinstance(x, nn.Partitioned))[0]
  return {"/".join(str(key.key) for key in path): (tuple(leaf.value.shape), tuple(leaf.names))
          for path, leaf in leaves}


@pytest.mark.parametrize("name", list(CASES))
def test_decoder_param_tree_is_unchanged(name):
  family, overrides, expected = CASES[name]
  config = models.get(family).config_cls(**SMALL, **overrides)
  assert param_tree(family, config) == expected


def test_lpcsm_attention_and_mlp_param_trees_are_unchanged():
  config = LPCSMConfig(**SMALL, attention_window=4, chunk_size=4, memory_dim=8, forget_gate="data_dependent")
  tree = param_tree("lpcsm", config)
  attention_and_mlp = {k: v for k, v in tree.items() if k.startswith(("layers/attn/", "layers/mlp/"))}
  expected = {k: v for k, v in {**LLAMA, **DATA_DEPENDENT_GATE}.items()
              if k.startswith(("layers/attn/", "layers/mlp/"))}
  assert attention_and_mlp == expected

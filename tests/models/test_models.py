import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpcjax import experiment as C
from lpcjax import models
from lpcjax.paper_recipe import paper_experiment

VARIANTS = [
    ("transformer", dict(block="llama")),
    ("transformer", dict(block="pro")),
    ("transformer", dict(block="llama", use_rope=False)),
    ("fox", dict(block="llama")),
    ("fox", dict(block="pro")),
    ("fox", dict(block="llama", use_rope=True)),
    ("fox", dict(forget_gate="data_independent")),
    ("fox", dict(forget_gate="fixed", scan_layers=False, remat_policy="full")),
]


def build(family, **kw):
  fam = models.get(family)
  cfg = fam.config_cls(vocab_size=50, d_model=32, num_layers=2, num_heads=4, mlp_multiple_of=32,
                       attention_impl="xla", **kw)
  model = fam.build(cfg)
  tokens = jnp.zeros((2, 24), jnp.int32)
  params = model.init(jax.random.PRNGKey(0), tokens)
  return model, params


@pytest.mark.parametrize("family,kw", VARIANTS)
def test_causal(family, kw):
  model, params = build(family, **kw)
  apply = jax.jit(model.apply)
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, 50, size=(2, 24)))
  logits = apply(params, tokens)
  assert logits.shape == (2, 24, 50) and logits.dtype == jnp.float32
  for t in (0, 9, 22):
    changed = apply(params, tokens.at[:, t + 1:].set((tokens[:, t + 1:] + 7) % 50))
    np.testing.assert_allclose(changed[:, :t + 1], logits[:, :t + 1], atol=1e-5)
    assert not np.allclose(changed[:, t + 1:], logits[:, t + 1:])


@pytest.mark.parametrize("family,kw", [VARIANTS[1], VARIANTS[4]])
def test_segments_are_independent_documents(family, kw):
  model, params = build(family, **kw)
  rng = np.random.default_rng(1)
  tokens = jnp.asarray(rng.integers(0, 50, size=(1, 24)))
  seg = jnp.asarray([[0] * 10 + [1] * 14])
  packed = model.apply(params, tokens, segment_ids=seg)
  alone = model.apply(params, tokens[:, 10:])
  np.testing.assert_allclose(packed[:, 10:], alone, atol=1e-5)


def test_every_param_has_logical_axis_names():
  _, params = build("fox", block="pro")
  leaves = jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, nn.Partitioned))
  assert leaves and all(isinstance(x, nn.Partitioned) for x in leaves)
  for leaf in leaves:
    assert len(leaf.names) == leaf.value.ndim
  specs = nn.get_partition_spec(params)["params"]
  assert specs["layers"]["attn"]["q_proj"]["kernel"] == jax.sharding.PartitionSpec(
      "layers", "embed", "heads", "head_dim")


def test_remat_changes_nothing_numerically():
  model, params = build("fox", block="pro")
  fam = models.get("fox")
  remat = fam.build(dataclasses.replace(model.config, remat_policy="full"))
  tokens = jnp.arange(24).reshape(1, 24) % 50
  loss = lambda m: lambda p: jnp.sum(m.apply(p, tokens) ** 2)
  g1, g2 = jax.jit(jax.grad(loss(model)))(params), jax.jit(jax.grad(loss(remat)))(params)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_pro_parts_switch_individually():
  _, params = build("fox", block="llama", qk_norm=True)
  attn = params["params"]["layers"]["attn"]
  assert "q_norm" in attn and "g_proj" not in attn and "k_shift" not in attn
  _, params = build("fox", block="pro", kv_shift=False)
  attn = params["params"]["layers"]["attn"]
  assert "k_shift" not in attn and "g_proj" in attn and "o_norm" in attn


def test_registry():
  assert {"fox", "transformer"} <= set(models.names())
  with pytest.raises(C.ConfigError, match="model.family: unknown model family 'mamba'"):
    models.get("mamba")
  with pytest.raises(TypeError, match="needs a FoXConfig"):
    models.get("fox").build(models.TransformerConfig())


def _count(params, skip=("lm_head",)):
  return sum(int(np.prod(x.shape)) for path, x in jax.tree_util.tree_flatten_with_path(params)[0]
             if not any(getattr(p, "key", None) in skip for p in path))


def fox_760m_parameters(block):
  """FoX 760M's parameter count without the LM head, term by term from the architecture
  (REFERENCE.md): 24 layers, d_model 1536, 24 heads x 64, GPT-2 vocabulary, untied head."""
  layers, d, heads, head_dim, vocab = 24, 1536, 24, 64, 50257
  pro = block == "pro"
  hidden = 3584 if pro else 4096  # SwiGLU 256 * ceil(int(d * ratio * 2/3) / 256), ratio 3.5 Pro, 4 LLaMA
  attention = (5 if pro else 4) * d * heads * head_dim  # q, k, v, o (+ the Pro output gate)
  forget_gate = d * heads + heads  # w_f and b_f per head
  kv_shift = 2 * d * heads if pro else 0  # one shift gate per head for k and for v, no bias
  # q and k norm: one scale shared by all heads (qk_norm_shared_scale); the output norm: one
  # per channel of every head, 24 x 64, whatever that flag says (the official model).
  head_norms = 2 * head_dim + heads * head_dim if pro else 0
  layer = attention + forget_gate + kv_shift + head_norms + 2 * d + 3 * d * hidden  # + 2 RMSNorms
  return vocab * d + layers * layer + d  # + token embedding, final norm


@pytest.mark.parametrize("block,table6_millions", [("llama", 757), ("pro", 759)])
def test_fox_760m_matches_paper_parameter_count(block, table6_millions):
  """The exact count, so that any change to a block's parameters fails (Pro is only 1.8M
  above LLaMA), and FoX paper Table 6: FoX (LLaMA) 757M, FoX (Pro) 759M (without the LM head)."""
  cfg = paper_experiment("fox", "760m", block).model
  model = models.get("fox").build(cfg)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))
  count = _count(nn.meta.unbox(shapes))
  assert count == fox_760m_parameters(block), count
  # Table 6 gives whole millions, ours are 757.6M and 759.4M: within the million above it.
  assert 0 <= count / 1e6 - table6_millions < 1, count


def test_fox_prune_epsilon_reaches_the_kernel(monkeypatch):
  from lpcjax.layers import attention
  seen, exact_op = [], attention.forgetting_attention

  def spy(*args, **kwargs):
    seen.append(kwargs["prune_epsilon"])
    return exact_op(*args, **kwargs)

  monkeypatch.setattr(attention, "forgetting_attention", spy)
  model, params = build("fox")
  tokens = jnp.arange(512).reshape(1, 512) % 50  # four 128-blocks: far tiles decay away
  exact = model.apply(params, tokens)
  pruned = models.get("fox").build(dataclasses.replace(model.config, prune_epsilon=1e-6))
  np.testing.assert_allclose(pruned.apply(params, tokens), exact, atol=1e-4)
  assert seen[-1] == 1e-6 and seen[0] is None
  with pytest.raises(ValueError, match="model.prune_epsilon"):
    dataclasses.replace(model.config, prune_epsilon=2.0)


def test_attention_window_bounds_what_a_position_sees():
  """FoX, one layer, window 4: the logits at t depend on tokens t-3..t only (LLaMA block: no
  KV-shift to widen the reach), and a change reaches exactly the 4 positions from itself.
  The transformer family shares the field and the attention layer."""
  fam = models.get("fox")
  cfg = fam.config_cls(vocab_size=50, d_model=32, num_layers=1, num_heads=4, mlp_multiple_of=32,
                       attention_impl="xla", attention_window=4)
  model = fam.build(cfg)
  tokens = jnp.asarray(np.random.default_rng(2).integers(0, 50, size=(1, 24)))
  params = model.init(jax.random.PRNGKey(0), tokens)
  apply = jax.jit(model.apply)
  logits, changed = apply(params, tokens), apply(params, tokens.at[:, 5].add(7) % 50)
  moved = np.abs(np.asarray(changed - logits)).max(axis=(0, 2)) > 1e-6
  np.testing.assert_array_equal(np.flatnonzero(moved), [5, 6, 7, 8])
  with pytest.raises(ValueError, match="model.attention_window"):
    dataclasses.replace(cfg, attention_window=0)


def test_grouped_query_attention_trains_and_is_causal():
  """FoX (Pro) with num_kv_heads=2 of 4 heads: k, v, the KV-shift gates and the per-head k
  QK-norm scales at 2 heads; causal, and every parameter gets a non-zero gradient. (The
  transformer family runs the same layer without the gate.)"""
  model, params = build("fox", block="pro", qk_norm_shared_scale=False, num_kv_heads=2)
  leaves = jax.tree_util.tree_leaves_with_path(nn.meta.unbox(params))
  shapes = {jax.tree_util.keystr(path): x.shape for path, x in leaves}
  shape_of = lambda *names: next(shape for path, shape in shapes.items() if all(f"'{n}'" in path for n in names))
  assert shape_of("q_proj")[-2:] == (4, 8) and shape_of("k_proj")[-2:] == (2, 8) and shape_of("v_proj")[-2:] == (2, 8)
  assert shape_of("k_norm")[-2:] == (2, 8) and shape_of("k_shift", "kernel")[-1] == 2
  rng = np.random.default_rng(2)
  tokens = jnp.asarray(rng.integers(0, 50, size=(2, 24)))
  apply = jax.jit(model.apply)
  logits = apply(params, tokens)
  changed = apply(params, tokens.at[:, 10:].set((tokens[:, 10:] + 7) % 50))
  np.testing.assert_allclose(changed[:, :10], logits[:, :10], atol=1e-5)
  assert not np.allclose(changed[:, 10:], logits[:, 10:])

  def loss(params):
    logits = model.apply(params, tokens[:, :-1])
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], axis=-1))
  grads = jax.jit(jax.grad(loss))(params)
  for path, g in jax.tree_util.tree_leaves_with_path(nn.meta.unbox(grads)):
    assert float(jnp.max(jnp.abs(g))) > 0, jax.tree_util.keystr(path)


def test_num_kv_heads_is_checked_in_one_line():
  from lpcjax.config import ConfigError
  from lpcjax.models import FoXConfig, LPCSMConfig
  for cls in (FoXConfig, LPCSMConfig):
    with pytest.raises(ConfigError, match="^model.num_kv_heads: num_heads=4 is not divisible by num_kv_heads=3$"):
      cls(d_model=32, num_heads=4, num_kv_heads=3)
    with pytest.raises(ConfigError, match="^model.num_kv_heads: must be >= 1 or None, got 0$"):
      cls(d_model=32, num_heads=4, num_kv_heads=0)
  assert FoXConfig(d_model=32, num_heads=4, num_kv_heads=2).attention_config().kv_heads == 2
  assert FoXConfig(d_model=32, num_heads=4).attention_config().kv_heads == 4


def test_fox_gate_bias_learning_rate_scale_reaches_the_gate_bias_only():
  """FoX's train section takes lr_scales (the gate recipes of docs/mechanisms.md): the rule
  "forget_gate/proj/bias=10" multiplies the update of every layer's gate bias by 10 and leaves
  every other update (the gate's own kernel included) as the plain optimizer's."""
  from lpcjax.training.steps import make_optimizer, path_name
  config = C.apply_overrides(C.load_experiment("mechanisms:delayed_id-fox_pro_gate_lr"), ["train.steps=10",
                                                                                            "train.warmup_steps=0"])
  assert config.train.lr_scales == ("forget_gate/proj/bias=10",)
  params = models.get("fox").build(config.model).init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))["params"]
  grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5), params)
  scaled, plain = make_optimizer(config.train), make_optimizer(dataclasses.replace(config.train, lr_scales=()))
  updates = scaled.update(grads, scaled.init(params), params)[0]
  reference = plain.update(grads, plain.init(params), params)[0]
  paths = []
  for (path, update), expected in zip(jax.tree_util.tree_leaves_with_path(updates), jax.tree.leaves(reference)):
    name = path_name(path)
    factor = 10.0 if "forget_gate/proj/bias" in name else 1.0
    paths += [name] if factor != 1.0 else []
    np.testing.assert_allclose(update, factor * expected, rtol=1e-6, err_msg=name)
  assert paths == ["layers/attn/forget_gate/proj/bias/value"]


def test_paper_fox_configs_start_the_gate_from_the_recipe_and_old_runs_keep_theirs():
  """The paper configs use lpcjax's FoX gate recipe (T(b), timescales from a quarter of the
  training length to 4x it; docs/fox.md says why); the paper's bias 0 is one override away, and
  a run saved with it loads with it."""
  from lpcjax.paper_recipe import PAPER_SIZES
  for size in PAPER_SIZES:
    config = paper_experiment("fox", size, "pro")
    gate = config.model.gate_config()
    length = config.data.seq_len
    assert (gate.bias_init, gate.t_min, gate.t_max) == ("timescale", length / 4, 4 * length)
  zero = C.apply_overrides(config, ["model.gate_bias_init=zero"])
  assert C.from_dict(C.to_dict(zero)).model.gate_bias_init == "zero"
  saved = C.to_dict(zero)
  for name in ("gate_bias_init", "gate_t_min", "gate_t_max"):  # a config.json from before the fields
    del saved["model"][name]
  assert C.from_dict(saved).model.gate_config().bias_init == "zero"

"""lpcjax.convert without PyTorch: export -> import round trips, format detection, one-line
refusals of what lpcjax cannot represent, atomic writes, and converted runs used by the
harness (load_run, generate, train.init_from). The logit equivalence with a PyTorch model is
in test_fla_peer.py."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpcjax import convert, models
from lpcjax.convert import ConvertError, formats, weights
from lpcjax.convert.__main__ import main as convert_main
from lpcjax.models import FoXConfig, TransformerConfig

TINY = dict(vocab_size=64, d_model=32, num_layers=2, num_heads=4)


def random_params(cfg, seed=0):
  """The model's params with every leaf random (norm scales too, so that a wrong reshape of a
  per-head scale shows)."""
  module = models.get(cfg.family).build(cfg)
  params = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32)))["params"]
  import flax.linen as nn
  rng = np.random.default_rng(seed)  # numpy: jax.random would compile once per shape
  return jax.tree.map(lambda leaf: (0.5 * rng.standard_normal(leaf.shape)).astype(np.float32), nn.meta.unbox(params))


def assert_same_params(a, b):
  flat_a = dict(jax.tree_util.tree_leaves_with_path(a))
  flat_b = dict(jax.tree_util.tree_leaves_with_path(b))
  assert flat_a.keys() == flat_b.keys()
  for path in flat_a:
    np.testing.assert_array_equal(np.asarray(flat_a[path]), np.asarray(flat_b[path]), err_msg=str(path))


ROUND_TRIPS = {
    "fox_llama": FoXConfig(**TINY),
    "fox_pro_shared_qk": FoXConfig(**TINY, block="pro", qk_norm_shared_scale=True),
    "fox_pro_per_head_qk_rope": FoXConfig(**TINY, block="pro", qk_norm_shared_scale=False, use_rope=True),
    "fox_data_independent": FoXConfig(**TINY, forget_gate="data_independent", gate_t_min=3.0, gate_t_max=50.0),
    "fox_fixed_gate_output_norm": FoXConfig(**TINY, forget_gate="fixed", output_norm=True),
    "fox_tied_odd_width": FoXConfig(**dict(TINY, d_model=40, num_heads=5), tie_embeddings=True, mlp_ratio=2.3,
                                    mlp_multiple_of=24, output_gate=True, kv_shift=True),
    "transformer_llama_window": TransformerConfig(**TINY, attention_window=5, rope_theta=500000.0),
    "transformer_pro": TransformerConfig(**TINY, block="pro"),
    # grouped-query attention: 4 query heads on 2 key/value heads (the official Transformer has it)
    "transformer_llama_gqa": TransformerConfig(**TINY, num_kv_heads=2),
}
# fla's FoX with grouped-query attention (the official FoX layer has none), per-head QK-norm:
# k_proj and k_norm at 2 heads, q_proj, f_proj, g_proj at 4
FLA_GQA = FoXConfig(**TINY, num_kv_heads=2, qk_norm=True, qk_norm_shared_scale=False, output_gate=True)


@pytest.mark.parametrize("fmt,name", [("official", name) for name in ROUND_TRIPS] +
                         [("fla", "fox_llama"), ("fla", "fox_tied_odd_width_fla"), ("fla", "fox_gqa")])
def test_export_import_round_trip_is_exact(tmp_path, fmt, name):
  if name == "fox_tied_odd_width_fla":  # what fla can hold: no KV-shift
    cfg = dataclasses.replace(ROUND_TRIPS["fox_tied_odd_width"], kv_shift=False, qk_norm=True,
                              qk_norm_shared_scale=False)
  elif name == "fox_gqa":
    cfg = FLA_GQA
  else:
    cfg = ROUND_TRIPS[name]
  params = random_params(cfg)
  hf = convert.save_hf(tmp_path / "hf", fmt, cfg, params)
  assert formats.detect(hf) == (fmt, hf["model_type"])
  got_fmt, got_cfg, got_params = convert.load_hf(tmp_path / "hf")
  assert got_fmt == fmt
  assert_same_params(params, got_params)
  # The imported config builds the same model; a second trip leaves it unchanged.
  assert got_cfg.mlp_hidden_size == cfg.mlp_hidden_size
  for field in ("use_qk_norm", "use_output_gate", "use_output_norm", "use_kv_shift", "use_rope", "rope_theta",
                "tie_embeddings", "attention_window", "forget_gate", "norm_eps", "num_kv_heads"):
    assert getattr(got_cfg, field, None) == getattr(cfg, field, None), field
  convert.save_hf(tmp_path / "hf2", fmt, got_cfg, got_params)
  assert convert.load_hf(tmp_path / "hf2")[1] == got_cfg


def test_grouped_query_tensors_have_the_key_value_heads(tmp_path):
  """fla with num_kv_heads=2 of 4: k/v projections [2 * head_dim, d] and k_norm [2 * head_dim]
  as fla's layer holds them; config.json says num_kv_heads; the official FoX format refuses
  to export it in one line."""
  tensors = weights.from_params("fla", FLA_GQA, random_params(FLA_GQA))
  p = "model.layers.0."
  assert tensors[p + "attn.q_proj.weight"].shape == (32, 32)
  assert tensors[p + "attn.k_proj.weight"].shape == tensors[p + "attn.v_proj.weight"].shape == (16, 32)
  assert tensors[p + "attn.k_norm.weight"].shape == (16,) and tensors[p + "attn.q_norm.weight"].shape == (32,)
  assert tensors[p + "attn.f_proj.weight"].shape == (4, 32)
  assert formats.hf_config("fla", FLA_GQA)["num_kv_heads"] == 2
  with pytest.raises(ConvertError, match="^model.num_kv_heads: the official FoX layer has no grouped-query"):
    formats.hf_config("official", FLA_GQA)


def test_official_names_and_layouts(tmp_path):
  """The official Pro layout: ShiftLinear k/v, fused gate/up MLP (gate first), per-channel
  output norm of every head, shared QK-norm scale [head_dim]."""
  cfg = FoXConfig(**TINY, block="pro", qk_norm_shared_scale=True)
  params = random_params(cfg)
  tensors = weights.from_params("official", cfg, params)
  layer = params["layers"]
  p = "model.layers.1."
  attn = layer["attn"]
  np.testing.assert_array_equal(tensors[p + "attn.k_proj.linear.weight"], attn["k_proj"]["kernel"][1].reshape(32, 32).T)
  np.testing.assert_array_equal(tensors[p + "attn.v_proj.shift_proj.weight"], attn["v_shift"]["gate"]["kernel"][1].T)
  fused = tensors[p + "mlp.gate_proj.weight"]
  hidden = cfg.mlp_hidden_size
  assert fused.shape == (2 * hidden, 32)
  np.testing.assert_array_equal(fused[:hidden], layer["mlp"]["w_gate"]["kernel"][1].T)
  assert tensors[p + "attn.output_norm.weight"].shape == (32,)
  assert tensors[p + "attn.q_norm.weight"].shape == (8,)
  np.testing.assert_array_equal(tensors[p + "attn.o_proj.weight"], attn["o_proj"]["kernel"][1].reshape(32, 32).T)


def _hf_dir(tmp_path, cfg, fmt="official", edit=None, tensors_edit=None):
  """An HF directory of random weights, its config.json edited by ``edit(dict)``."""
  params = random_params(cfg)
  path = tmp_path / "hf"
  convert.save_hf(path, fmt, cfg, params)
  if edit:
    config = json.loads((path / "config.json").read_text())
    edit(config)
    (path / "config.json").write_text(json.dumps(config))
  if tensors_edit:
    from safetensors.numpy import load_file, save_file
    tensors = load_file(path / "model.safetensors")
    tensors_edit(tensors)
    save_file(tensors, path / "model.safetensors")
  return path


@pytest.mark.parametrize("fmt,edit,message", [
    ("official", lambda c: c.update(num_kv_heads=2), "num_kv_heads: 2 key/value heads for 4 query heads: the "
     "official FoX layer has no grouped-query attention"),
    ("fla", lambda c: c.update(num_kv_heads=3), "num_kv_heads: 3 key/value heads for 4 query heads: they must divide"),
    ("official", lambda c: c.update(use_k_shift=True, use_v_shift=False), "use_k_shift:"),
    ("official", lambda c: c.update(ogate_act="silu"), "ogate_act:"),
    ("official", lambda c: c.update(hidden_act="gelu"), "hidden_act:"),
    ("official", lambda c: c.update(fgate_type="sliding"), "fgate_type:"),
    ("official", lambda c: c.update(fgate_type="fixed", fgate_bias_init=True, decay_time_min=None), "decay_time_min:"),
    ("official", lambda c: c.update(model_type="llama"), "model_type: 'llama'"),
    ("fla", lambda c: c.update(window_size=64), "window_size:"),
    ("fla", lambda c: c.update(qkv_bias=True), "qkv_bias:"),
    ("fla", lambda c: c.update(attnres_block_size=2), "attnres_block_size:"),
])
def test_unsupported_options_are_one_line_errors(tmp_path, capsys, fmt, edit, message):
  path = _hf_dir(tmp_path, FoXConfig(**TINY), fmt, edit)
  assert convert_main([str(path), str(tmp_path / "run")]) == 2
  err = capsys.readouterr().err
  assert err.startswith(f"error: {message}") and err.count("\n") == 1, err
  assert not (tmp_path / "run").exists()
  assert [p for p in os.listdir(tmp_path) if p.startswith(".")] == []  # no staging left behind


@pytest.mark.parametrize("tensors_edit,message", [
    (lambda t: t.update(extra=np.zeros(3, np.float32)), "unexpected tensor extra"),
    (lambda t: t.pop("model.layers.1.attn.fgate_proj.bias"), "missing tensor model.layers.1.attn.fgate_proj.bias"),
    (lambda t: t.update({"model.layers.0.attn_norm.weight": np.ones(31, np.float32)}), "['layers']['attn_norm']"),
])
def test_tensor_mismatches_are_named(tmp_path, tensors_edit, message):
  path = _hf_dir(tmp_path, FoXConfig(**TINY), tensors_edit=tensors_edit)
  with pytest.raises(ConvertError, match=None) as error:
    convert.load_hf(path)
  assert message in str(error.value)


def test_detects_the_first_official_release_and_checks_the_fixed_gate(tmp_path):
  cfg = FoXConfig(**TINY, forget_gate="fixed", gate_t_min=2.0, gate_t_max=64.0)
  path = _hf_dir(tmp_path, cfg, edit=lambda c: c.update(model_type="forgetting_transformer"))
  fmt, got, _ = convert.load_hf(path)  # the old name, read as official because of fgate_type
  assert (fmt, got.forget_gate, got.gate_t_max) == ("official", "fixed", 64.0)
  config = json.loads((path / "config.json").read_text())
  config["decay_time_max"] = 100.0  # the stored buffer no longer matches
  (path / "config.json").write_text(json.dumps(config))
  with pytest.raises(ConvertError, match="fgate_bias: the fixed gate's values"):
    convert.load_hf(path)


@pytest.mark.parametrize("fmt,cfg,message", [
    ("official", FoXConfig(**TINY, attention_window=8), "model.attention_window:"),
    ("official", FoXConfig(**TINY, head_dim=16), "model.head_dim:"),
    ("fla", FoXConfig(**TINY, kv_shift=True), "model.kv_shift:"),
    ("fla", FoXConfig(**TINY, forget_gate="fixed"), "model.forget_gate:"),
    ("fla", TransformerConfig(**TINY), "model.family:"),
])
def test_export_refuses_what_the_target_cannot_hold(tmp_path, fmt, cfg, message):
  with pytest.raises(ConvertError, match=message.replace(".", r"\.")):
    formats.hf_config(fmt, cfg)


def test_converted_run_works_with_the_harness(tmp_path, capsys):
  """CLI import -> load_run, generate, train.init_from; existing OUT needs --force, and --force
  never replaces a folder this tool did not write."""
  from lpcjax import generate
  from lpcjax.experiment import apply_overrides
  from lpcjax.runs import load_run
  from lpcjax.training import train

  cfg = FoXConfig(**TINY, block="pro")
  params = random_params(cfg)
  convert.save_hf(tmp_path / "hf", "official", cfg, params)
  run = tmp_path / "run"
  assert convert_main([str(tmp_path / "hf"), str(run), "--seq-len", "32"]) == 0
  loaded = load_run(str(run))
  assert loaded.step == 0 and loaded.config.data.seq_len == 32
  assert_same_params(params, jax.device_get(loaded.params))

  assert convert_main([str(tmp_path / "hf"), str(run)]) == 2
  assert "exists; pass --force" in capsys.readouterr().err
  assert convert_main([str(tmp_path / "hf"), str(run), "--seq-len", "32", "--force"]) == 0
  other = tmp_path / "notes"
  other.mkdir()
  (other / "keep.txt").write_text("x")
  assert convert_main([str(tmp_path / "hf"), str(other), "--force"]) == 2
  assert "is not what this tool writes" in capsys.readouterr().err and (other / "keep.txt").exists()

  assert generate.main(["--run", str(run), "--token-ids", "1,2,3", "--max-new-tokens", "3"]) == 0

  config = apply_overrides(loaded.config, [f"train.init_from={run}", "train.steps=1", "train.warmup_steps=0",
                                           "data.batch_size=2", f"train.run_dir={tmp_path}", "train.run_name=ft"])
  run_dir, _ = train(config, progress=False, devices=jax.devices()[:1])
  tuned = load_run(run_dir)
  assert tuned.step == 1
  before = jax.tree.leaves(params)
  after = jax.tree.leaves(jax.device_get(tuned.params))
  assert max(float(np.abs(a - b).max()) for a, b in zip(before, after)) < 0.1  # one small step from the import


def test_shared_qk_scale_exports_to_fla_as_one_scale_per_head(tmp_path):
  cfg = FoXConfig(**TINY, qk_norm=True, qk_norm_shared_scale=True)
  params = random_params(cfg)
  convert.save_hf(tmp_path / "hf", "fla", cfg, params)
  _, got_cfg, got = convert.load_hf(tmp_path / "hf")
  assert not got_cfg.qk_norm_shared_scale
  shared = params["layers"]["attn"]["q_norm"]["scale"]  # [layers, head_dim]
  np.testing.assert_array_equal(got["layers"]["attn"]["q_norm"]["scale"],
                                np.broadcast_to(shared[:, None], (2, 4, 8)))


def test_bin_weights_without_torch_is_a_one_line_error(tmp_path, monkeypatch):
  import sys
  path = _hf_dir(tmp_path, FoXConfig(**TINY))
  (path / "model.safetensors").unlink()
  (path / "pytorch_model.bin").write_bytes(b"not read")
  monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
  with pytest.raises(ConvertError, match=r"holds PyTorch \.bin weights, which need torch"):
    convert.load_hf(path)


def test_import_then_export_keeps_every_source_key_and_ordinary_permissions(tmp_path, gpt2_rank_file):
  """The export writes back the keys of the imported config.json that lpcjax does not set (the
  package's defaults differ: fuse_cross_entropy is True there), with a plain file's permissions;
  the import records the tokenizer it is given."""
  cfg = FoXConfig(**dict(TINY, vocab_size=50257))
  extra = {"bos_token_id": 50256, "eos_token_id": 50256, "pad_token_id": None, "use_cache": True,
           "max_position_embeddings": 16384, "fuse_cross_entropy": False, "fuse_norm": True,
           "transformers_version": "4.44.0"}
  hf = _hf_dir(tmp_path, cfg, edit=lambda config: config.update(extra))
  source = json.loads((hf / "config.json").read_text())
  run, out = tmp_path / "run", tmp_path / "exported"
  rank_file = gpt2_rank_file
  assert convert_main([str(hf), str(run), "--seq-len", "32", "--tokenizer-file", rank_file]) == 0
  assert json.loads((run / "config.json").read_text())["data"]["tokenizer_file"] == rank_file
  assert convert_main(["--to-hf", str(run), str(out)]) == 0
  exported = json.loads((out / "config.json").read_text())
  assert exported == source  # every key, every value
  umask = os.umask(0)
  os.umask(umask)
  for path in (out, run):
    assert path.stat().st_mode & 0o777 == 0o777 & ~umask
  for path in (out / "config.json", out / "model.safetensors", run / "config.json"):
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
  missing = str(tmp_path / "none")
  assert convert_main([str(hf), str(tmp_path / "again"), "--tokenizer-file", missing]) == 2

"""Equivalence with flash-linear-attention's FoX (PyPI ``flash-linear-attention``, CPU PyTorch).

fla's model runs Triton kernels, which need a GPU; here every one it calls is replaced by fla's
own pure-PyTorch reference of the same op (attention by ``naive_forgetting_attn``, the norms by
``rms_norm_ref``/``group_norm_ref``, the fused SwiGLU by its unfused formula). Random weights
(norm scales and gate biases included), saved with ``save_pretrained``, converted by the CLI,
logits compared in float32; then lpcjax exports the run and fla loads it back bit for bit.
Skipped, with the reason, where torch or fla is not installed (``pip install -e ".[peer]"``).
"""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs torch: pip install -e '.[peer]'")
pytest.importorskip("fla", reason="needs flash-linear-attention: pip install -e '.[peer]'")

from lpcjax.convert.__main__ import main as convert_main  # noqa: E402

TOLERANCE = 1e-4  # float32 logits, max abs difference
VOCAB, SEQ = 64, 19  # a length that is not a multiple of any tile


@pytest.fixture
def fla_reference(monkeypatch):
  """fla's FoX classes with its GPU kernels swapped for its PyTorch reference ops."""
  import warnings
  warnings.filterwarnings("ignore", message="Triton is not supported")
  import torch.nn.functional as F
  import fla.layers.forgetting_attn as attention
  from fla.models import ForgettingTransformerConfig, ForgettingTransformerForCausalLM
  from fla.modules import mlp
  from fla.modules.norm import layernorm
  from fla.ops.forgetting_attn.naive import naive_forgetting_attn

  def reference_attention(q, k, v, g, cu_seqlens=None, **unused):
    assert cu_seqlens is None  # no padding in these tests
    return naive_forgetting_attn(q, k, v, g).to(q.dtype)

  def rms_norm(self, x, residual=None, prenorm=False, residual_in_fp32=False):
    return layernorm.rms_norm_ref(x, self.weight, self.bias, residual=residual, eps=self.eps, prenorm=prenorm,
                                  upcast=True)

  def group_norm(self, x, residual=None, prenorm=False, residual_in_fp32=False):
    return layernorm.group_norm_ref(x, self.weight, self.bias, self.num_groups, residual=residual, eps=self.eps,
                                    is_rms_norm=self.is_rms_norm, prenorm=prenorm, upcast=True)

  monkeypatch.setattr(attention, "parallel_forgetting_attn", reference_attention)
  monkeypatch.setattr(layernorm.RMSNorm, "forward", rms_norm)
  monkeypatch.setattr(layernorm.GroupNorm, "forward", group_norm)
  monkeypatch.setattr(mlp.SwiGLULinear, "forward", lambda self, x, y, w, b: F.linear(F.silu(x) * y, w, b))
  return ForgettingTransformerConfig, ForgettingTransformerForCausalLM


def random_fla_model(fla_reference, seed=0, **options):
  config_cls, model_cls = fla_reference
  config = config_cls(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_heads=4, **options)
  torch.manual_seed(seed)
  model = model_cls(config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      scale = 0.3 if p.ndim == 1 else 0.5 / p.shape[-1] ** 0.5
      p.copy_(torch.randn_like(p) * scale + (1.0 if name.endswith("norm.weight") else 0.0))
  return model


def fla_logits(model, tokens):
  with torch.no_grad():
    return model(torch.as_tensor(tokens), use_cache=False).logits.numpy()


def lpcjax_logits(run_dir, tokens):
  from lpcjax.runs import load_run
  run = load_run(str(run_dir))
  return np.asarray(run.model.apply(run.variables, tokens))


OPTIONS = {
    "plain": {},
    "output_gate": dict(use_output_gate=True),
    "qk_norm": dict(qk_norm=True),
    "qk_norm_output_gate": dict(qk_norm=True, use_output_gate=True),
    "tied_eps_width": dict(tie_word_embeddings=True, norm_eps=1e-5, intermediate_size=72, use_output_gate=True),
    # grouped-query attention: 2 key/value heads for 4 query heads (fla's num_kv_heads), k_norm per kv head
    "gqa_qk_norm_output_gate": dict(num_kv_heads=2, qk_norm=True, use_output_gate=True),
}


@pytest.mark.parametrize("name", OPTIONS)
def test_logits_match_fla_and_export_round_trips(tmp_path, fla_reference, name):
  model = random_fla_model(fla_reference, **OPTIONS[name])
  model.save_pretrained(tmp_path / "fla")
  tokens = np.random.default_rng(1).integers(0, VOCAB, size=(2, SEQ))
  expected = fla_logits(model, tokens)

  assert convert_main([str(tmp_path / "fla"), str(tmp_path / "run"), "--seq-len", "32"]) == 0
  got = lpcjax_logits(tmp_path / "run", tokens)
  error = np.abs(got - expected).max()
  print(f"fla {name}: max |logit difference| {error:.2e} (max |logit| {np.abs(expected).max():.2f})")
  assert error < TOLERANCE

  # Export -> fla: the same tensors bit for bit, so the same logits.
  assert convert_main(["--to-hf", str(tmp_path / "run"), str(tmp_path / "back"), "--format", "fla"]) == 0
  config_cls, model_cls = fla_reference
  back = model_cls.from_pretrained(tmp_path / "back").eval()
  original = model.state_dict()
  for key, value in back.state_dict().items():
    assert torch.equal(value, original[key]), key
  np.testing.assert_array_equal(fla_logits(back, tokens), expected)
  exported = json.loads((tmp_path / "back" / "config.json").read_text())
  for key in ("qk_norm", "use_output_gate", "tie_word_embeddings", "norm_eps", "hidden_size", "num_heads",
              "num_kv_heads"):
    assert exported[key] == getattr(model.config, key), key


def test_pytorch_bin_weights(tmp_path, fla_reference):
  """A directory with pytorch_model.bin instead of safetensors (read through torch)."""
  model = random_fla_model(fla_reference, seed=3, qk_norm=True)
  model.config.save_pretrained(tmp_path / "fla")  # config.json; the weights as older savers wrote them:
  torch.save(model.state_dict(), tmp_path / "fla" / "pytorch_model.bin")
  tokens = np.random.default_rng(2).integers(0, VOCAB, size=(1, SEQ))
  assert convert_main([str(tmp_path / "fla"), str(tmp_path / "run"), "--seq-len", "32"]) == 0
  assert np.abs(lpcjax_logits(tmp_path / "run", tokens) - fla_logits(model, tokens)).max() < TOLERANCE

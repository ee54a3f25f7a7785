"""The official FoX model against its lpcjax import: logits of the same random weights.

Builds the FoX authors' PyTorch models (a checkout of their repository, given with --repo; not a
dependency of lpcjax) on CPU, with every GPU-only op they call replaced by plain PyTorch math
written here from the ops' definitions: forgetting attention (softmax of q.k / sqrt(d) + c_i - c_j,
c = cumsum log f, causal), the data-dependent token shift, RoPE (half-split pairs), the RMS and
group norms (their own reference functions), the gated group norm, the fused SwiGLU/GLU
projections, and FlashAttention for the LLaMA Transformer. Each model gets random weights (norm
scales and gate biases too), is saved with ``save_pretrained``, converted with
``lpcjax.convert`` and run by lpcjax in float32; the table gives the largest absolute logit
difference and that difference relative to the largest logit.

  python benchmarks/official_fox_equivalence.py --repo PATH/forgetting-transformer [--out FILE]

Needs torch, transformers, einops and triton (imported by the official modules, not run):
``pip install -e ".[peer]"``. The official code was written for transformers 4.44; it also
builds with the version the peer extra installs.
"""

import argparse
import math
import os
import subprocess
import sys
import tempfile
import warnings

os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")

import numpy as np  # noqa: E402
from results_file import write_results  # noqa: E402

SIZE = dict(vocab_size=512, hidden_size=128, num_hidden_layers=2, num_heads=4)
PRO = dict(qk_norm=True, use_output_gate=True, use_output_norm=True, use_k_shift=True, use_v_shift=True,
           hidden_ratio=3.5)
CASES = {  # name -> (official model type, config fields)
    "FoX (LLaMA)": ("fox", {}),
    "FoX (LLaMA), RoPE": ("fox", dict(use_rope=True, rope_base=500000.0)),
    "FoX (LLaMA), data-independent gate": ("fox", dict(fgate_type="bias_only", fgate_bias_init=True,
                                                       decay_time_min=2.0, decay_time_max=128.0)),
    "FoX (LLaMA), fixed gate": ("fox", dict(fgate_type="fixed", fgate_bias_init=True, decay_time_min=2.0,
                                            decay_time_max=128.0)),
    "FoX (Pro), QK-norm scale shared": ("fox", dict(PRO, qk_norm_share_param_across_head=True)),
    "FoX (Pro), QK-norm per head": ("fox", dict(PRO, qk_norm_share_param_across_head=False)),
    "FoX (Pro), output gate only": ("fox", dict(use_output_gate=True)),
    # d = 110, ratio 3.5: the SwiGLU width where truncating before rounding up matters (256, not 512)
    "FoX (Pro), d = 110, 2 heads": ("fox", dict(PRO, hidden_size=110, num_heads=2)),
    "Transformer (Pro)": ("fox", dict(PRO, fgate_type="none", use_rope=True, rope_base=500000.0)),
    "Transformer (LLaMA)": ("transformer", dict(rope_base=500000.0)),
    "Transformer (LLaMA), window 16": ("transformer", dict(rope_base=500000.0, window_size=16)),
}


# ----------------------------------------------------------------------------- reference math


def reference_ops(torch):
  """The PyTorch stand-ins for the GPU-only ops (see the module docstring)."""
  F = torch.nn.functional

  def forgetting_attention(q, k, v, log_fgate, head_first=False, seq_start=None, sm_scale=None,
                           adaptive_threshold=None):
    assert head_first and seq_start is None and adaptive_threshold is None
    c = torch.cumsum(log_fgate.float(), dim=-1)  # [B, H, T]
    scores = torch.einsum("bhid,bhjd->bhij", q.float(), k.float()) * sm_scale + c[..., :, None] - c[..., None, :]
    length = q.shape[2]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    weights = torch.softmax(scores.masked_fill(~causal, -math.inf), dim=-1)
    return torch.einsum("bhij,bhjd->bhid", weights, v.float()).to(q.dtype)

  def token_shift(x, prev_weight, curr_weight):  # x [B, T, H, D], weights [B, T, H]
    previous = F.pad(x, (0, 0, 0, 0, 1, 0))[:, :-1]
    return prev_weight[..., None] * previous + curr_weight[..., None] * x

  def rotary_forward(self, q, k, seqlen_offset=0, max_seqlen=None, **unused):
    assert isinstance(seqlen_offset, int) and not getattr(self, "interleaved", False)
    assert getattr(self, "scale_base", None) is None
    half = self.dim // 2
    inv_freq = 1.0 / self.base ** (torch.arange(0, self.dim, 2, dtype=torch.float32) / self.dim)
    angle = torch.outer(torch.arange(q.shape[1], dtype=torch.float32) + seqlen_offset, inv_freq)
    cos, sin = angle.cos()[None, :, None, :], angle.sin()[None, :, None, :]

    def rotate(x):
      x1, x2 = x[..., :half].float(), x[..., half:].float()
      return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)
    return rotate(q), rotate(k)

  def flash_attn_func(q, k, v, causal=True, window_size=(-1, -1)):  # [B, T, H, D]
    length = q.shape[1]
    i, j = torch.arange(length)[:, None], torch.arange(length)[None, :]
    allowed = j <= i
    if window_size[0] >= 0:
      allowed &= j >= i - window_size[0]
    scores = torch.einsum("bihd,bjhd->bhij", q.float(), k.float()) / math.sqrt(q.shape[-1])
    weights = torch.softmax(scores.masked_fill(~allowed, -math.inf), dim=-1)
    return torch.einsum("bhij,bjhd->bihd", weights, v.float()).to(q.dtype)

  def glu_linear(x, y, weight, bias):
    return F.linear(torch.sigmoid(x) * y, weight, bias)

  def swiglu_linear(x, y, weight, bias):
    return F.linear(F.silu(x) * y, weight, bias)

  return dict(forgetting_attention=forgetting_attention, token_shift=token_shift, rotary_forward=rotary_forward,
              flash_attn_func=flash_attn_func, glu_linear=glu_linear, swiglu_linear=swiglu_linear)


def patch_official(torch, fox_modeling, transformer_modeling):
  """Swap the official modules' GPU-only ops for ``reference_ops``."""
  from forgetting_transformer.model.forgetting_transformer import fuse_norm_gate, layernorm, rotary
  from fla.modules import RMSNorm as FlaRMSNorm
  from fla.modules import RotaryEmbedding as FlaRotary
  from fla.modules.norm import layernorm as fla_layernorm
  ops = reference_ops(torch)
  fox_modeling.forgetting_attention = ops["forgetting_attention"]
  fox_modeling.token_shift = ops["token_shift"]
  fox_modeling.glu_linear = ops["glu_linear"]
  fox_modeling.swiglu_linear = ops["swiglu_linear"]
  transformer_modeling.swiglu_linear = ops["swiglu_linear"]
  transformer_modeling.flash_attn_func = ops["flash_attn_func"]
  rotary.RotaryEmbedding.forward = ops["rotary_forward"]
  FlaRotary.forward = ops["rotary_forward"]
  layernorm.RMSNorm.forward = lambda self, x, residual=None, prenorm=False, residual_in_fp32=False: \
      layernorm.rms_norm_ref(x, self.weight, self.bias, residual=residual, eps=self.eps, prenorm=prenorm, upcast=True)
  layernorm.GroupNorm.forward = lambda self, x, residual=None, prenorm=False, residual_in_fp32=False: \
      layernorm.group_norm_ref(x, self.weight, self.bias, self.num_groups, residual=residual, eps=self.eps,
                               is_rms_norm=self.is_rms_norm, prenorm=prenorm, upcast=True)
  fuse_norm_gate.FusedGroupNormGated.forward = lambda self, x, g, residual=None, prenorm=False, \
      residual_in_fp32=False: fuse_norm_gate.group_norm_gated_ref(
          x, g, self.weight, self.bias, self.num_groups, residual=residual, eps=self.eps,
          is_rms_norm=self.is_rms_norm, prenorm=prenorm, upcast=True)
  FlaRMSNorm.forward = lambda self, x, residual=None, prenorm=False, residual_in_fp32=False: \
      fla_layernorm.rms_norm_ref(x, self.weight, self.bias, residual=residual, eps=self.eps, prenorm=prenorm,
                                 upcast=True)


# ----------------------------------------------------------------------------- comparison


def randomize(torch, model, seed):
  """Random weights at a scale that keeps activations O(1): norm scales near 1, gate biases spread."""
  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=generator)
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.3 * noise)
      elif p.ndim == 1:  # gate biases
        p.copy_(1.5 + noise)
      else:
        p.copy_(noise / math.sqrt(p.shape[-1]))


def compare(torch, model_cls, config, tokens, seed, workdir, name):
  from lpcjax.convert import import_checkpoint
  from lpcjax.runs import load_run
  model = model_cls(config).eval()
  randomize(torch, model, seed)
  with torch.no_grad():
    expected = model(input_ids=torch.as_tensor(tokens), use_cache=False).logits.float().numpy()
  hf_dir, run_dir = os.path.join(workdir, f"hf{seed}"), os.path.join(workdir, f"run{seed}")
  # config.json + model.safetensors, as save_pretrained writes them (which newer transformers
  # refuse for these classes' old-style tied-weight declarations)
  config.save_pretrained(hf_dir)
  from safetensors.torch import save_file
  save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(hf_dir, "model.safetensors"))
  import_checkpoint(hf_dir, run_dir, seq_len=tokens.shape[1])
  run = load_run(run_dir)
  got = np.asarray(run.model.apply(run.variables, tokens))
  difference = float(np.abs(got - expected).max())
  largest = float(np.abs(expected).max())
  return {"case": name, "lpcjax_model": run.config.model.describe(), "family": run.config.model.family,
          "max_abs_diff": difference, "max_abs_logit": largest, "relative": difference / largest,
          "export_reloads_exactly": exports_exactly(torch, model, run_dir, tokens, expected)}


def exports_exactly(torch, model, run_dir, tokens, expected):
  """lpcjax's export of the converted run, loaded by the official class (strict state dict):
  the same tensors, so the same logits, bit for bit."""
  from safetensors.torch import load_file
  from lpcjax.convert import export_run
  out = run_dir + "-exported"
  export_run(run_dir, out, fmt="official")
  config = type(model.config).from_json_file(os.path.join(out, "config.json"))
  reloaded = type(model)(config).eval()
  reloaded.load_state_dict(load_file(os.path.join(out, "model.safetensors")), strict=True)
  same_tensors = all(torch.equal(v, model.state_dict()[k]) for k, v in reloaded.state_dict().items())
  with torch.no_grad():
    logits = reloaded(input_ids=torch.as_tensor(tokens), use_cache=False).logits.float().numpy()
  return bool(same_tensors and np.array_equal(logits, expected))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--repo", required=True, help="a checkout of the official forgetting-transformer repository")
  parser.add_argument("--seq-len", type=int, default=67)
  parser.add_argument("--batch", type=int, default=2)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", default=None,
                      help="JSON path (default benchmarks/results/official_fox_equivalence_cpu.json)")
  args = parser.parse_args(argv)

  warnings.filterwarnings("ignore")
  sys.path.insert(0, os.path.join(os.path.abspath(args.repo), "src"))
  import torch
  import transformers
  import forgetting_transformer.model.forgetting_transformer.modeling_forgetting_transformer as fox_modeling
  import forgetting_transformer.model.transformer.modeling_transformer as transformer_modeling
  from forgetting_transformer.model.forgetting_transformer import ForgettingTransformerConfig
  from forgetting_transformer.model.transformer.configuration_transformer import TransformerConfig
  patch_official(torch, fox_modeling, transformer_modeling)
  classes = {"fox": (ForgettingTransformerConfig, fox_modeling.ForgettingTransformerForCausalLM),
             "transformer": (TransformerConfig, transformer_modeling.TransformerForCausalLM)}

  tokens = np.random.default_rng(args.seed).integers(0, SIZE["vocab_size"], size=(args.batch, args.seq_len))
  rows = []
  with tempfile.TemporaryDirectory() as workdir:
    for i, (name, (kind, fields)) in enumerate(CASES.items()):
      config_cls, model_cls = classes[kind]
      config = config_cls(**dict(SIZE, **fields))
      rows.append(compare(torch, model_cls, config, tokens, args.seed + i, os.path.join(workdir, str(i)), name))
      row = rows[-1]
      print(f"{name:40s} {row['lpcjax_model']:14s} max |diff| {row['max_abs_diff']:.2e}  "
            f"relative {row['relative']:.2e}  (max |logit| {row['max_abs_logit']:.1f})  "
            f"export reloads exactly: {row['export_reloads_exactly']}", flush=True)

  try:
    commit = subprocess.run(["git", "-C", args.repo, "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    commit = None
  write_results("official_fox_equivalence", {
      "official_commit": commit, "torch": torch.__version__, "transformers": transformers.__version__,
      "sizes": SIZE, "seq_len": args.seq_len, "batch": args.batch, "seed": args.seed,
      "max_relative": max(r["relative"] for r in rows), "cases": rows}, args.out)


if __name__ == "__main__":
  main()

"""The FoX paper's model sizes and training recipe (LongCrawl64, GPT-2 tokenizer, 16k context).

Used by configs/paper.py. Steps are the token budget divided by the 32 x 16384 tokens per step,
with the budgets of the official configs (configs/experiment/longcrawl64/*/<block>_<size>_*.yaml
in the FoX repository), which are binary: 2.5 Gi, 7 Gi and 15 Gi tokens (the paper's text rounds
them to 2.7B, 7.5B and 16B); warm-up is 256 Mi tokens (the paper's 256M). Every budget is a
whole number of steps: 5120, 14336 and 30720, warm-up 512.
"""

from lpcjax.config import ConfigError, TrainConfig
from lpcjax.data import TokenFileConfig
from lpcjax.experiment import ExperimentConfig
from lpcjax.models import FoXConfig, TransformerConfig

TOKENS_PER_STEP = 32 * 16384  # 32 sequences of SEQ_LEN
GI = 2 ** 30
WARMUP_TOKENS = 256 * 2 ** 20  # 268,435,456
# size -> (layers, d_model, FoX heads, peak lr, training tokens)
PAPER_SIZES = {
    "125m": (12, 768, 12, 2e-3, 5 * GI // 2),  # 2,684,354,560 (official *_125m_2b)
    "360m": (24, 1024, 16, 2e-3, 7 * GI),  # 7,516,192,768 (*_360m_7b)
    "760m": (24, 1536, 24, 1e-3, 15 * GI),  # 16,106,127,360 (*_760m_16b)
}
# The official Transformer baselines use RoPE base 500000 at every size; so do the FoX configs
# (where RoPE is off unless model.use_rope=true).
ROPE_THETA = 500000.0
SEQ_LEN = 16384
# FoX's gate starts from lpcjax's default recipe, not the paper's bias 0: the T(b) init, the heads'
# timescales geometric from a quarter of the training length to 4x it (docs/mechanisms.md, "FoX's
# gate recipe": with bias 0, f = 0.5, every head of a small FoX stayed at a memory under 2.5 tokens
# and learned none of the recall tasks; heads started short rarely open, heads started open close
# where they must). model.gate_bias_init=zero gives the paper's init.
FOX_GATE = dict(gate_bias_init="timescale", gate_t_min=SEQ_LEN / 4, gate_t_max=4.0 * SEQ_LEN)


def paper_experiment(family, size, block="llama"):
  """ExperimentConfig for a paper-size ``family`` ("fox" or "transformer") model.

  Data is not set: prepare a token file (python -m lpcjax.data) and give data.train_tokens=PREFIX.
  """
  if size not in PAPER_SIZES or family not in ("fox", "transformer") or block not in ("llama", "pro"):
    raise ConfigError(f"paper config: unknown {family}/{block}/{size}; families fox, transformer; "
                      f"blocks llama, pro; sizes {sorted(PAPER_SIZES)}")
  layers, d_model, heads, lr, tokens = PAPER_SIZES[size]
  common = dict(vocab_size=50257, d_model=d_model, num_layers=layers, block=block, dtype="bfloat16",
                remat_policy="full", rope_theta=ROPE_THETA)
  if family == "fox":
    model = FoXConfig(num_heads=heads, **FOX_GATE, **common)
  elif size == "760m":  # the paper's 760M Transformer (LLaMA and Pro) uses fewer, wider heads
    model = TransformerConfig(num_heads=12, head_dim=128, **common)
  else:
    model = TransformerConfig(num_heads=heads, **common)
  steps = tokens // TOKENS_PER_STEP
  train = TrainConfig(steps=steps, learning_rate=lr, warmup_steps=WARMUP_TOKENS // TOKENS_PER_STEP,
                      log_every=50, eval_every=1000, eval_batches=16)
  data = TokenFileConfig(seq_len=SEQ_LEN, batch_size=32)
  suffix = "" if block == "llama" else f"_{block}"
  return ExperimentConfig(model=model, data=data, train=train, name=f"{family}{suffix}_{size}")


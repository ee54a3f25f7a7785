"""The FoX paper's model sizes and training recipe (LongCrawl64, GPT-2 tokenizer, 16k context).

Used by the configs/*_{125m,360m,760m}.py experiment files. Steps are the paper's token budget
divided by its 32 x 16384 tokens per step; warmup is its 256M tokens.
"""

from lpcjax.config import ConfigError, ExperimentConfig, TrainConfig
from lpcjax.data import TokenFileConfig

from .fox import FoXConfig
from .transformer import TransformerConfig

TOKENS_PER_STEP = 32 * 16384
# size -> (layers, d_model, FoX heads, peak lr, training tokens)
PAPER_SIZES = {
    "125m": (12, 768, 12, 2e-3, 2.7e9),
    "360m": (24, 1024, 16, 2e-3, 7.5e9),
    "760m": (24, 1536, 24, 1e-3, 16e9),
}


def paper_experiment(family, size, block="llama"):
  """ExperimentConfig for a paper-size ``family`` ("fox" or "transformer") model.

  Data is not set: prepare a token file (python -m lpcjax.data) and give data.train_tokens=PREFIX.
  """
  if size not in PAPER_SIZES or family not in ("fox", "transformer") or block not in ("llama", "pro"):
    raise ConfigError(f"paper config: unknown {family}/{block}/{size}; families fox, transformer; "
                      f"blocks llama, pro; sizes {sorted(PAPER_SIZES)}")
  layers, d_model, heads, lr, tokens = PAPER_SIZES[size]
  common = dict(vocab_size=50257, d_model=d_model, num_layers=layers, block=block, dtype="bfloat16",
                remat_policy="full")
  if family == "fox":
    model = FoXConfig(num_heads=heads, **common)
  elif size == "760m":  # the paper's 760M Transformer uses fewer, wider heads and RoPE base 5e5
    model = TransformerConfig(num_heads=12, head_dim=128, rope_theta=500000.0, **common)
  else:
    model = TransformerConfig(num_heads=heads, **common)
  steps = int(tokens // TOKENS_PER_STEP)
  train = TrainConfig(steps=steps, learning_rate=lr, warmup_steps=int(256e6 // TOKENS_PER_STEP),
                      log_every=50, eval_every=1000, eval_batches=16)
  data = TokenFileConfig(seq_len=16384, batch_size=32)
  suffix = "" if block == "llama" else f"_{block}"
  return ExperimentConfig(model=model, data=data, train=train, name=f"{family}{suffix}_{size}")


"""The default job: a tiny FoX (2 layers, d=64) learns multi-query associative recall on CPU.

Runs in a few minutes on 2 CPU cores with no download. The same budget trains the baselines:
  python train.py --config fox_tiny_mqar model.family=transformer                    # RoPE
  python train.py --config fox_tiny_mqar model.family=transformer model.use_rope=false  # NoPE
"""

from lpcjax.experiment import ExperimentConfig, TrainConfig
from lpcjax.data import MQARDataConfig
from lpcjax.models import FoXConfig


def get_config():
  # Sized for 2 CPU cores: 256 tokens (127 keys, 128 values), 8 pairs per 64-token example.
  model = FoXConfig(vocab_size=256, d_model=64, num_layers=2, num_heads=4, mlp_multiple_of=64,
                    tie_embeddings=True)
  data = MQARDataConfig(seq_len=64, batch_size=64, mqar_vocab_size=256, mqar_num_pairs=8)
  train = TrainConfig(steps=1500, learning_rate=1e-2, warmup_steps=100, weight_decay=0.1,
                      log_every=25, eval_batches=16)
  return ExperimentConfig(model=model, data=data, train=train, name="fox_tiny_mqar")

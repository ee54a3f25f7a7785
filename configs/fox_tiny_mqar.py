"""The default job: a tiny FoX (Pro block, 2 layers, d=64) learns multi-query associative recall on CPU.

About a minute on 2 CPU cores with no download. Chosen from the mechanism suite's measurements
(docs/mechanisms.md, docs/fox.md "Default task"): the Pro block's KV-shift lets one layer find
"the token after the key", and the T(b) gate init starts the heads' memories at 16 to 256 tokens
(a quarter of the training length to 4x it: lpcjax's FoX recipe, docs/mechanisms.md "FoX's gate
recipe") instead of the paper's ~1.4 (bias 0), so recall over the 64-token sequence needs no gate
to open first.
The same budget trains the baselines:
  python train.py model.family=transformer                       # Transformer (Pro), RoPE
  python train.py model.block=llama                              # FoX (LLaMA)
  python train.py model.block=llama model.gate_bias_init=zero    # FoX (LLaMA), the paper's gate init
  python train.py model.family=transformer model.block=llama     # Transformer (LLaMA), RoPE
"""

from lpcjax.experiment import ExperimentConfig, TrainConfig
from lpcjax.data import MQARDataConfig
from lpcjax.models import FoXConfig


def get_config():
  # Sized for 2 CPU cores: 256 tokens (127 keys, 128 values), 8 pairs per 64-token example.
  model = FoXConfig(vocab_size=256, d_model=64, num_layers=2, num_heads=4, mlp_multiple_of=64,
                    tie_embeddings=True, block="pro", gate_bias_init="timescale", gate_t_min=16, gate_t_max=256)
  data = MQARDataConfig(seq_len=64, batch_size=64, mqar_vocab_size=256, mqar_num_pairs=8)
  train = TrainConfig(steps=500, learning_rate=1e-2, warmup_steps=50, weight_decay=0.1,
                      log_every=25, eval_batches=16)
  return ExperimentConfig(model=model, data=data, train=train, name="fox_tiny_mqar")

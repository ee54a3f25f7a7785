"""A tiny FoX language model on your text (GPT-2 tokens), trainable on CPU in minutes.

  python train.py --config fox_tiny_text data.train_files=a.txt,b.txt.gz data.eval_files=c.txt \
      data.tokenizer_file=gpt2.tiktoken     # the rank file is needed only offline
  python train.py --config fox_tiny_text data.kind=tokens data.train_tokens=PREFIX data.eval_tokens=PREFIX2

About 0.7 s a step on 2 CPU cores (the 50257-way output layer dominates); the Transformer
baseline: model.family=transformer.
"""

from lpcjax.experiment import ExperimentConfig, TrainConfig
from lpcjax.data import TextDataConfig
from lpcjax.models import FoXConfig


def get_config():
  model = FoXConfig(vocab_size=50257, d_model=128, num_layers=4, num_heads=4, mlp_multiple_of=64,
                    tie_embeddings=True)
  data = TextDataConfig(seq_len=256, batch_size=4)
  train = TrainConfig(steps=600, learning_rate=2e-3, warmup_steps=50, log_every=25, eval_batches=16)
  return ExperimentConfig(model=model, data=data, train=train, name="fox_tiny_text")

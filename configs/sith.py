"""Gradual Forgetting (SITH) experiments: ``--config sith:<spec>``.

  sith:k100_L53        a grid point of the paper: k in {100, 150, 200}, L in {5, 9, ..., 53}, m = 256,
                       GPT-2 small, windows of M + m tokens with stride m (M = tau*_max)
  sith:delta_L53       the delta-pulse control with L filters
  sith:tiny_L37        a CPU-sized model (2 layers, d = 128, m = 64) with L = 37 (M = 512): the README
                       example (train.steps=3000); any L works, e.g. tiny_L21 (M = 32)
  sith:tiny_delta_L37  its control

Data is not set: add data.train_tokens=PREFIX (python -m lpcjax.data) or data.kind=text
data.train_files=... . The filter spacing is c = 2^(1/4) - 1, the value behind the paper's table
of windows (it writes c = 0.19; see lpcjax/layers/sith.py).
"""

import re

from lpcjax.experiment import ConfigError, ExperimentConfig, TrainConfig
from lpcjax.data import TokenFileConfig
from lpcjax.models import SITHConfig


def get_config(spec="k100_L53"):
  match = re.fullmatch(r"(tiny_)?(?:k(\d+)_|(delta)_)?L(\d+)", spec)
  if not match:
    raise ConfigError(f"sith:{spec}: expected [tiny_][k<K>_|delta_]L<L>, e.g. k100_L53 or tiny_delta_L21")
  tiny, k, delta, filters = match.group(1), match.group(2), match.group(3), int(match.group(4))
  size = dict(d_model=128, num_layers=2, num_heads=4, mlp_dim=512, chunk_len=64) if tiny else {}
  model = SITHConfig(num_filters=filters, k=float(k or 100), delta_pulse=bool(delta), **size)
  chunk = model.chunk_len
  data = TokenFileConfig(seq_len=model.window_len, batch_size=4 if tiny else 32,
                    window_stride=chunk)
  train = (TrainConfig(steps=600, learning_rate=1e-3, warmup_steps=50, log_every=25, eval_batches=16) if tiny
           else TrainConfig(steps=20000, learning_rate=6e-4, warmup_steps=1000, log_every=50, eval_every=1000))
  return ExperimentConfig(model=model, data=data, train=train, name=f"sith_{spec}")

"""The ``sith`` family's config (the model is in ``lpcjax.models.sith``). No JAX: a command line
checks it before JAX loads."""

import dataclasses
from typing import ClassVar

from lpcjax.config import require
from lpcjax.layers.configs import TABLE_C

from .decoder_config import DecoderConfig


@dataclasses.dataclass(frozen=True)
class SITHConfig(DecoderConfig):
  """GPT-2 small by default (12 x 768, 12 heads, MLP 3072, vocab 50304, no dropout).

  ``scan_layers``: the blocks as one ``nn.scan`` (params under "layers", a leading layer axis),
  with ``remat_policy``; False unrolls them as "h_0" ... (the layout of runs saved before the
  scan existed: their config.json has no ``scan_layers`` key and loads with False)."""

  family: ClassVar[str] = "sith"

  vocab_size: int = 50304
  mlp_dim: int = 3072
  num_filters: int = 53  # L
  k: float = 100.0
  c: float = TABLE_C  # the paper's table of windows; it writes 0.19 (see lpcjax.layers.sith)
  tau_min: float = 1.0
  chunk_len: int = 256  # m: the uncompressed tokens, the only ones predicted
  delta_pulse: bool = False  # the control: slots are the L preceding tokens, uncompressed
  scan_layers: bool = True

  def __post_init__(self):
    super().__post_init__()
    for name in ("mlp_dim", "num_filters", "chunk_len"):
      require(getattr(self, name) >= 1, f"model.{name}", f"must be >= 1, got {getattr(self, name)}")
    require(self.k > 0, "model.k", "must be > 0")
    require(self.c > 0, "model.c", "must be > 0")

  def check_experiment(self, experiment):
    """The vocabulary; text is cut into windows of exactly H + m tokens (stride m); a generated
    task's sequence may be longer (the model reads its last H + m tokens; eval.py's windows then
    need a multiple of m)."""
    super().check_experiment(experiment)
    window, seq_len = self.window_len, experiment.data.seq_len
    if experiment.data.is_text_stream:
      require(seq_len == window, "data.seq_len",
              f"the sith model reads windows of {window} tokens (H + m), got {seq_len}")
    else:
      require(seq_len >= window, "data.seq_len",
              f"the sith model reads the last {window} tokens (H + m) of each sequence: needs seq_len >= {window}, "
              f"got {seq_len}")

  def describe(self):
    """A short label for plots and reports."""
    return f"delta L={self.num_filters}" if self.delta_pulse else f"L={self.num_filters}, k={self.k:g}"

  @property
  def history_len(self):
    """H: tokens before the chunk that the slots summarize."""
    if self.delta_pulse:
      return self.num_filters
    # the last of lpcjax.layers.sith.sith_peaks: tau*_L = tau_min (1 + c)^(L - 1)
    return int(round(self.tau_min * (1.0 + self.c) ** (self.num_filters - 1)))

  @property
  def window_len(self):
    return self.history_len + self.chunk_len

"""PMT pre-training on a time-series classification file (UCR/UEA .tsv[.gz] or .npz), or on
generated series (``synthetic``).

  python train.py --config pmt:tiny data.train_file=Wafer_TRAIN.tsv.gz
  python train.py --config pmt:tiny_full data.train_file=...       # the full-attention baseline
  python train.py --config pmt:paper data.train_file=... data.eval_file=...   # GPU sizes
  python train.py --config pmt:synthetic_cue                       # generated series, no file
  python eval.py --run runs/<run>                                  # linear and cue probes

Names are SIZE[_VARIANT...]. Sizes: tiny and paper read a file (``data.kind=series``);
synthetic is the tiny model on the ``synthetic_series`` kind (2,048 generated training series,
enough for in-batch negatives; lpcjax/data/synthetic_series.py), with its own batch and steps.
Variants, which combine (``synthetic_cue_no_pcl``, ``tiny_cue_full``): "", _full, _full_matched,
_stateless, _no_pcl (λ_PCL = 0), _cue (non-overlapping windows: the PMA the paper's
cue-retention probe ran), _spec_views (the spec's views and PCL τ). ``_full`` is the paper's
baseline (as many full-attention layers as PMA blocks, fewer parameters: a PMA block also holds
the aggregator and a second MLP); ``_full_matched`` has twice the layers, near PMT's parameter
count (tiny: 386k against 400k). With _cue, the full-attention baselines' final-window feature
(the mean of that window's tokens) is read on the same non-overlapping windows.

Gates (the PMT spec §9): the memory gates (``lpcjax.models.pmt.GATE_PATTERNS``) are their own
parameter group (``train.gate_patterns``) with the spec's Adam b2 0.95 and clip 100, and a
learning rate ``GATE_LR_SCALE`` times the rest (``train.lr_scales``): their gradients are small
and noisy, and with the group's settings alone they move about 0.01 in logit in the 40 steps of
tests/models/test_pmt_train.py (as without a group), about 0.1 with the scale.
``tiny`` pre-trains on 2 CPU cores in a few minutes (Wafer: 152 samples -> 37 tokens,
windows of 7 tokens at stride 3). ``paper`` has the sizes of the PMT spec §9 (the later code's
CirCor/OpenPack configs; the paper's own sizes were not recovered): d 320, 8 heads, MLP 1280,
3 PMA blocks with 3 memory slots, 256 tokenizer kernels, 3 neighbourhood layers of 20 tokens,
Adam (0.9, 0.999), lr 2e-4 cosine to 2e-5, no weight decay, batch 32, clip 50, 200k updates
(the spec's count; a GPU run, not a CPU one).
"""

import dataclasses

from lpcjax.experiment import ExperimentConfig
from lpcjax.data import SeriesDataConfig, SyntheticSeriesConfig
from lpcjax.models import PMTConfig
from lpcjax.models.pmt_config import GATE_PATTERNS, PMTTrainConfig

# Views and PCL (chosen on the validation splits of TRAIN files, docs/pmt_results.md, "Figures"): the spec's jitter of
# 0.01 / 0.03 leaves the two views nearly equal, and its τ = 0.9 with 512 negatives puts PCL's floor
# (orthogonal negatives) at log(1 + 512 e^{-1/0.9}) ≈ 5.13, where it sits from the first steps.
VIEWS = dict(view_noise=(0.3, 0.3), view_scale=(0.1, 0.1), view_mask=(0.1, 0.1), pcl_temperature=0.2,
             pcl_negatives=128)
TINY = PMTConfig(d_model=64, num_heads=4, num_blocks=3, num_slots=1, tokenizer_kernels=64, projection_dim=128,
                 patch_size=8, patch_stride=4, post_layers=1, neighbourhood=8, **VIEWS)
PAPER = PMTConfig(d_model=320, num_heads=8, num_blocks=3, num_slots=3, tokenizer_kernels=256, projection_dim=512,
                  post_layers=3, neighbourhood=20, **VIEWS)
GATE_LR_SCALE = 10.0
GATES = dict(gate_patterns=GATE_PATTERNS, gate_adam_b2=0.95, gate_grad_clip=100.0,
             lr_scales=tuple(f"{pattern}={GATE_LR_SCALE:g}" for pattern in GATE_PATTERNS))
SPEC_VIEWS = dict(view_noise=(0.01, 0.03), view_scale=(0.0, 0.0), view_mask=(0.0, 0.0), pcl_temperature=0.9,
                  pcl_negatives=512)
VARIANTS = {"": {}, "_full": {"attention": "full"}, "_full_matched": {"attention": "full", "num_blocks": 6},
            "_stateless": {"memory": "stateless"}, "_no_pcl": {"pcl_weight": 0.0},
            "_cue": {"window_stride_fraction": 1.0}, "_spec_views": SPEC_VIEWS}
SIZES = ("tiny", "synthetic", "paper")
# The synthetic recipe (docs/pmt_results.md, "Cue retention on generated series"): the tiny model on 2,048
# generated series of 128 samples (31 tokens; _cue: 5 windows of 6), batches of 32 as in the spec (ICL:
# 62 in-batch negatives; PCL: 31 x 5 = 155 windows of other series for its 128), 200 steps (a CPU's).
SYNTHETIC_BATCH, SYNTHETIC_STEPS = 32, 200


def _variant_fields(text, name):
  """The merged fields of the variants spelled by ``text`` ("cue_no_pcl" -> _cue, _no_pcl), the
  longest name first ("full_matched" is one variant, not _full then "matched")."""
  fields, rest = {}, text
  while rest:
    match = max((v for v in VARIANTS if v and (rest == v[1:] or rest.startswith(v[1:] + "_"))), key=len, default=None)
    if match is None or set(VARIANTS[match]) & set(fields):
      raise ValueError(f"unknown pmt config {name!r}: SIZE[_VARIANT...], sizes {list(SIZES)}; variants "
                       f"{sorted(VARIANTS)} (each at most once, no two setting one field)")
    fields.update(VARIANTS[match])
    rest = rest[len(match):].lstrip("_")
  return fields


def get_config(name="tiny"):
  size, _, variant = name.partition("_")  # "tiny_full_matched" -> ("tiny", "full_matched")
  if size not in SIZES:
    raise ValueError(f"unknown pmt config {name!r}; sizes {list(SIZES)}; variants {sorted(VARIANTS)}")
  model = dataclasses.replace(PAPER if size == "paper" else TINY, **_variant_fields(variant, name))
  if size == "tiny":
    data = SeriesDataConfig(batch_size=32)
    train = PMTTrainConfig(steps=300, learning_rate=1e-3, warmup_steps=20, weight_decay=0.0, log_every=25,
                           eval_batches=0, **GATES)
  elif size == "synthetic":
    data = SyntheticSeriesConfig(batch_size=SYNTHETIC_BATCH)
    train = PMTTrainConfig(steps=SYNTHETIC_STEPS, learning_rate=1e-3, warmup_steps=20, weight_decay=0.0,
                           log_every=25, eval_batches=4, **GATES)  # held-out losses on 128 series
  else:
    data = SeriesDataConfig(batch_size=32)
    train = PMTTrainConfig(steps=200_000, learning_rate=2e-4, min_learning_rate=2e-5, warmup_steps=500,
                           weight_decay=0.0, adam_b2=0.999, grad_clip=50.0, log_every=100, eval_every=20_000,
                           eval_batches=0, checkpoint_every=5000, **GATES)
  return ExperimentConfig(model=model, data=data, train=train, name=f"pmt_{name}")

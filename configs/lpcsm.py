"""LPC-SM language models: the full model, the Stage-A ablations and the staged
A -> B -> C schedule, at a CPU size (``tiny``) and at the paper's 158M size (``paper``).

  python train.py --config lpcsm:tiny data.train_files=a.txt.gz,b.txt.gz data.eval_files=c.txt.gz
  python train.py --config lpcsm:tiny_no_ont ...            # a Stage-A ablation
  python train.py --config lpcsm:tiny_stage_b ...           # from runs/lpcsm_tiny (Stage A)
  python train.py --config lpcsm:tiny_stage_b_fixed ...     # the fixed-ratio control, same start
  python train.py --config lpcsm:tiny_stage_c ...           # from runs/lpcsm_tiny_stage_b, 2x length

Names: ``<size>`` (Stage A, full model), ``<size>_no_{mhc,slow,pc,ont,stop}`` (the five Stage-A
ablations of Table 2), ``<size>_stage_b`` / ``<size>_stage_b_fixed`` (Stage B, adaptive or fixed
sparse ratio) and ``<size>_stage_c`` (twice the sequence length). Every run is named after its
config (``runs/lpcsm_tiny``, ...) so that Stage B finds Stage A and C finds B through
``train.init_from``; override ``train.init_from`` to start from another run. Data are yours:
give text files (data.kind=text) or prepared token files (data.kind=tokens, see docs/training.md).

``paper``: 159,866,461 parameters, +0.98 % of the paper's 158,313,241 (its dimensions were not
recovered; 884,772 of them are mHC's input-dependent coefficients): GPT-2 vocabulary, tied
embeddings, d 768, 12 layers of 12 heads, SwiGLU 2048, memory 512, window 256, chunk 64, 4 mHC
streams; the memory's pooling query is in (768 a layer), its per-chunk decay shifts are not
(``selective_decay=False``: 2 x 512² a layer, 6.3M in all, would put the model 5 % above the
paper's count). Learning rate, batch and warm-up were not recovered (AdamW 6e-4, warm-up 1,000 steps).
``tiny``: d 128, 4 layers, sequence 256 (7.6M parameters, 6.4M of them the tied embedding):
200 steps took 3 to 10 minutes on 2 CPU cores shared with other jobs.

The stages as this file builds them (B and C take half of A's steps; C doubles the length):

  size   stage  steps    batch x length  tokens
  paper  A      16,000   1 x 2048        32.77M  (Table 1's)
  paper  B       8,000   1 x 2048        16.38M  (Table 1's)
  paper  C       8,000   1 x 4096        32.77M  (not recovered; chosen)
  tiny   A         300   4 x 256          0.31M
  tiny   B         150   4 x 256          0.15M
  tiny   C         150   4 x 512          0.31M

(The CPU figures in docs/lpcsm.md override train.steps: 200 for A, 100 for B.)

``train.lr_scales`` (LPC-SM's own train setting, ``LPCSMTrainConfig``): the controller's ratio
logit φ (ρ = 0.05 + 0.45 σ(φ), init −0.69) learns
at a multiple of the learning rate so that ρ can cross its range within one stage: Adam moves
φ by at most ~lr per step, and φ must move ~±3 to reach either bound, i.e. lr · steps · scale
≳ 3 over the ~half of a stage the cosine keeps the rate high: 10 for tiny (2e-3, 150-300 steps),
2 for paper (6e-4, 8,000-16,000 steps).
"""

import dataclasses

from lpcjax.experiment import ExperimentConfig
from lpcjax.data import TextDataConfig
from lpcjax.models import LPCSMConfig
from lpcjax.models.lpcsm_config import LPCSMTrainConfig

SIZES = {
    "tiny": (LPCSMConfig(d_model=128, num_layers=4, num_heads=4, mlp_multiple_of=64, attention_window=64,
                         chunk_size=32, memory_dim=64),
             TextDataConfig(seq_len=256, batch_size=4),
             LPCSMTrainConfig(steps=300, learning_rate=2e-3, warmup_steps=30, log_every=25, eval_batches=16,
                              lr_scales=("ratio_logit=10",))),
    "paper": (LPCSMConfig(d_model=768, num_layers=12, num_heads=12, memory_dim=512, attention_window=256,
                          chunk_size=64, selective_decay=False, remat_policy="dots_no_batch"),
              TextDataConfig(seq_len=2048, batch_size=1),
              LPCSMTrainConfig(steps=16_000, learning_rate=6e-4, min_learning_rate=6e-5, warmup_steps=1_000,
                               log_every=100, eval_every=2_000, checkpoint_every=2_000, eval_batches=64,
                               lr_scales=("ratio_logit=2",))),
}
ABLATIONS = {"no_mhc": "mhc", "no_slow": "slow_memory", "no_pc": "predictive_coding", "no_ont": "ont",
             "no_stop": "stop_head"}
# Continuations: (run they start from, model changes, data changes, fraction of Stage A's steps).
STAGES = {"stage_b": ("", {}, {}, 0.5), "stage_b_fixed": ("", {"learn_ratio": False}, {}, 0.5),
          "stage_c": ("_stage_b", {}, {"seq_len": 2}, 0.5)}


def get_config(name="tiny"):
  size, _, variant = name.partition("_")
  if size not in SIZES or (variant and variant not in ABLATIONS and variant not in STAGES):
    raise ValueError(f"unknown lpcsm config {name!r}; sizes {sorted(SIZES)}, variants "
                     f"{sorted(ABLATIONS) + sorted(STAGES)}")
  model, data, train = SIZES[size]
  run = f"lpcsm_{name}"
  if variant in ABLATIONS:
    model = dataclasses.replace(model, **{ABLATIONS[variant]: False})
  elif variant in STAGES:
    start, model_changes, data_changes, fraction = STAGES[variant]
    model = dataclasses.replace(model, **model_changes)
    if "seq_len" in data_changes:
      data = dataclasses.replace(data, seq_len=data.seq_len * data_changes["seq_len"])
    steps = max(1, int(train.steps * fraction))
    train = dataclasses.replace(train, steps=steps, warmup_steps=min(train.warmup_steps, steps // 10),
                                init_from=f"{train.run_dir}/lpcsm_{size}{start}",
                                eval_every=min(train.eval_every, steps),
                                checkpoint_every=min(train.checkpoint_every, steps))
  train = dataclasses.replace(train, run_name=run)
  return ExperimentConfig(model=model, data=data, train=train, name=run)

"""LPC-SM language models (lpc-sm-spec.md): the full model, the Stage-A ablations and the staged
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

``paper``: 158,963,281 parameters, +0.41 % of the paper's 158,313,241 (its dimensions were not
recovered): GPT-2 vocabulary, tied embeddings, d 768, 12 layers of 12 heads, SwiGLU 2048,
memory 512, window 256, chunk 64, 4 mHC streams. Its token budgets are Table 1's (A: 32.77M
= 16,000 steps of one 2048-token sequence; B: 16.38M; C at 4096 tokens: not recovered, 16.38M
chosen); learning rate, batch and warm-up were not recovered (AdamW 6e-4, warm-up 1,000 steps).
``tiny``: d 128, 4 layers, sequence 256 (7.6M parameters, 6.4M of them the tied embedding): 200 steps
took 3 to 10 minutes on 2 CPU cores shared with other jobs.
"""

import dataclasses

from lpcjax.experiment import ExperimentConfig, TrainConfig
from lpcjax.data import TextDataConfig
from lpcjax.models import LPCSMConfig

SIZES = {
    "tiny": (LPCSMConfig(d_model=128, num_layers=4, num_heads=4, mlp_multiple_of=64, attention_window=64,
                         chunk_size=32, memory_dim=64),
             TextDataConfig(seq_len=256, batch_size=4),
             TrainConfig(steps=300, learning_rate=2e-3, warmup_steps=30, log_every=25, eval_batches=16)),
    "paper": (LPCSMConfig(d_model=768, num_layers=12, num_heads=12, memory_dim=512, attention_window=256,
                          chunk_size=64, remat_policy="dots_no_batch"),
              TextDataConfig(seq_len=2048, batch_size=1),
              TrainConfig(steps=16_000, learning_rate=6e-4, min_learning_rate=6e-5, warmup_steps=1_000,
                          log_every=100, eval_every=2_000, checkpoint_every=2_000, eval_batches=64)),
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
                                eval_every=min(train.eval_every, steps), checkpoint_every=min(train.checkpoint_every, steps))
  train = dataclasses.replace(train, run_name=run)
  return ExperimentConfig(model=model, data=data, train=train, name=run)

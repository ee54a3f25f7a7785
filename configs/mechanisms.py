"""The mechanism suite (docs/mechanisms.md): generated tasks on which a paper's mechanism must make
the difference, each cell a small model trained on CPU in minutes. ``--config mechanisms:TASK``
or ``mechanisms:TASK-MODEL``:

  python train.py --config mechanisms:delayed_id-lpcsm_no_slow train.learning_rate=3e-3 train.seed=1
  python eval.py --run runs/mechanisms_delayed_id-lpcsm_no_slow --split test --eval-len 128

TASK (all 128 tokens, batch 32, vocabulary 256, scored only at the answers):
  mqar            8 key-value pairs, each key queried once later (Zoology); mqar_random: random filler
  overwrite       keys written again and again (8 keys, ~7 writes each); the answer is the latest value
  delayed_id      1-8 identifiers, 96 distractor tokens, a trigger, the identifiers again
  delayed_id_near the same with a 72-token gap: past what LPC-SM's two 32-token window layers reach
                  together (64 tokens) and SITH's delta control (27), inside SITH's compressed reach (91)
  delayed_id_repeat  1-4 identifiers each written 6 times in a row, the 72-token gap, recalled once:
                  an identifier that fills a share of a SITH slot's span (a lone one is ~1/15 of it)
  noisy_recall    MAD's noisy in-context recall (8 keys, 20 % noise tokens)
  fuzzy_recall    MAD's fuzzy recall (keys and values of 2 tokens, 8 entries)
  selective_copy  MAD's selective copying (16 tokens among blanks)

MODEL (d 64, 2 layers, 4 heads unless said; default fox):
  fox, fox_pro                     FoX, LLaMA or Pro block, the T(b) gate init (timescales 2 to 128)
  fox_paper_init                   FoX (LLaMA) with the paper's gate init (bias 0)
  fox_pro_long, fox_pro_zero,      FoX (Pro) with other gate recipes (issue #59): T(b) from 32 to 512
  fox_pro_gate_lr, fox_pro_wide,   tokens; the paper's bias 0; fox_pro's T(b) with the gate biases'
  fox_pro_rope                     learning rate 10x the rest (train.lr_scales); T(b) from 2 to 4,096;
                                   fox_pro with RoPE
  transformer, transformer_nope    LLaMA block with RoPE / without a positional encoding
  transformer_pro[_nope]           Pro block with RoPE / without a positional encoding
  lpcsm, lpcsm_no_{mhc,slow,pc,ont,stop}   LPC-SM (window 32, chunks of 16, memory 64) and its
                                   Stage-A ablations; lpcsm_full_window: a window over the whole sequence;
                                   lpcsm_mean_memory: the memory as before issue #32 (chunk means, fixed
                                   decays, W_c init 0.02); lpcsm_fixed_ratio: Stage B's control, the
                                   controller's firing rate ρ frozen at its init
  sith, sith_delta                 SITH with L = 27 slots (τ*_max = 91) and m = 32 predicted tokens,
                                   and the delta-pulse control (the 27 preceding tokens); a SITH model
                                   reads the last H + m tokens of each sequence, so it is scored on tasks
                                   whose answers end the sequence (delayed_id, selective_copy)

The learning rate here is a start; benchmarks/mechanisms.py sweeps three values per model and task
on the eval split and reports the test split.
"""

import dataclasses

from lpcjax.data import (DelayedIdConfig, FuzzyRecallConfig, MQARDataConfig, NoisyRecallConfig, OverwriteConfig,
                         SelectiveCopyConfig)
from lpcjax.config import LRScaledTrainConfig
from lpcjax.experiment import ConfigError, ExperimentConfig, TrainConfig
from lpcjax.models import FoXConfig, LPCSMConfig, SITHConfig, TransformerConfig
from lpcjax.models.lpcsm_config import LPCSMTrainConfig

SEQ_LEN, BATCH, VOCAB = 128, 32, 256
TASKS = {
    "mqar": MQARDataConfig(seq_len=SEQ_LEN, batch_size=BATCH, mqar_vocab_size=VOCAB, mqar_num_pairs=8),
    "mqar_random": MQARDataConfig(seq_len=SEQ_LEN, batch_size=BATCH, mqar_vocab_size=VOCAB, mqar_num_pairs=8,
                                  mqar_filler="random"),
    "overwrite": OverwriteConfig(seq_len=SEQ_LEN, batch_size=BATCH, task_vocab_size=VOCAB, overwrite_num_keys=8),
    "delayed_id": DelayedIdConfig(seq_len=SEQ_LEN, batch_size=BATCH, task_vocab_size=VOCAB, delayed_id_max_ids=8,
                                  delayed_id_gap=96),
    "delayed_id_near": DelayedIdConfig(seq_len=SEQ_LEN, batch_size=BATCH, task_vocab_size=VOCAB,
                                       delayed_id_max_ids=8, delayed_id_gap=72),
    # SITH's claim at a resolution its slots have: each identifier written 6 times in a row (the
    # slots at 40-70 tokens back average ~15 tokens each), 1-4 of them, 72 tokens before the trigger
    "delayed_id_repeat": DelayedIdConfig(seq_len=SEQ_LEN, batch_size=BATCH, task_vocab_size=VOCAB,
                                         delayed_id_max_ids=4, delayed_id_gap=72, delayed_id_repeat=6),
    "noisy_recall": NoisyRecallConfig(seq_len=SEQ_LEN, batch_size=BATCH, task_vocab_size=VOCAB, noisy_num_keys=8),
    "fuzzy_recall": FuzzyRecallConfig(seq_len=SEQ_LEN, batch_size=BATCH, task_vocab_size=VOCAB, fuzzy_num_keys=8),
    "selective_copy": SelectiveCopyConfig(seq_len=SEQ_LEN, batch_size=BATCH, task_vocab_size=VOCAB,
                                          copy_num_tokens=16),
}

_SIZE = dict(vocab_size=VOCAB, d_model=64, num_layers=2, num_heads=4)
_DECODER = dict(_SIZE, mlp_multiple_of=64, tie_embeddings=True)
# T(b): gate biases spread so that the heads' timescales -1 / log f run from 2 to 128 tokens
# (geometric over the 4 heads: 2, 8, 32, 128).
_TIMESCALE_GATE = dict(gate_bias_init="timescale", gate_t_max=128)
# The gate recipes of issue #59, each a FoX (Pro) beside fox_pro: T(b) with longer timescales
# (32 to 512 tokens: a quarter of the training length to 4x it, lpcjax's default FoX recipe since
# this grid), the paper's bias 0 (f = 0.5 at init), and the T(b) init of fox_pro with the gate
# biases learning 10x faster (FOX_RECIPE_LR_SCALES).
FOX_RECIPES = {
    "fox_pro_long": dict(gate_bias_init="timescale", gate_t_min=32, gate_t_max=512),
    "fox_pro_zero": dict(gate_bias_init="zero"),
    "fox_pro_gate_lr": _TIMESCALE_GATE,
    # From benchmarks/fox_gates.py: where FoX (Pro) recalls on delayed_id, a layer-0 head has opened
    # far past the training length (T ~ 1,800); where it fails, that head closed from 128 to ~50 in
    # the first 100 steps and never reopened. T(b) from 2 to 4,096 starts two heads of four past
    # the training length (323 and 4,096 tokens) and keeps two short ones (2 and 25) for recency.
    "fox_pro_wide": dict(gate_bias_init="timescale", gate_t_min=2, gate_t_max=4096),
    # fox_pro with RoPE: the Transformer (Pro) it is compared with has RoPE and FoX has none, so
    # this (and transformer_pro_nope on the same cells) separates what the gate costs from what
    # positions buy.
    "fox_pro_rope": dict(_TIMESCALE_GATE, use_rope=True),
}
FOX_RECIPE_LR_SCALES = {"fox_pro_gate_lr": ("forget_gate/proj/bias=10",)}
_LPCSM = LPCSMConfig(**_DECODER, attention_window=32, chunk_size=16, memory_dim=64)
LPCSM_ABLATIONS = {"no_mhc": "mhc", "no_slow": "slow_memory", "no_pc": "predictive_coding", "no_ont": "ont",
                   "no_stop": "stop_head"}
MODELS = {
    "fox": FoXConfig(**_DECODER, **_TIMESCALE_GATE),
    "fox_pro": FoXConfig(**_DECODER, **_TIMESCALE_GATE, block="pro"),
    "fox_paper_init": FoXConfig(**_DECODER),
    **{name: FoXConfig(**_DECODER, **gate, block="pro") for name, gate in FOX_RECIPES.items()},
    "transformer": TransformerConfig(**_DECODER),
    "transformer_nope": TransformerConfig(**_DECODER, use_rope=False),
    "transformer_pro": TransformerConfig(**_DECODER, block="pro"),
    "transformer_pro_nope": TransformerConfig(**_DECODER, block="pro", use_rope=False),
    "lpcsm": _LPCSM,
    **{f"lpcsm_{name}": dataclasses.replace(_LPCSM, **{field: False}) for name, field in LPCSM_ABLATIONS.items()},
    "lpcsm_full_window": dataclasses.replace(_LPCSM, attention_window=SEQ_LEN),
    "lpcsm_mean_memory": dataclasses.replace(_LPCSM, summary_pool="mean", selective_decay=False,
                                             summary_init_std=0.02),
    "lpcsm_fixed_ratio": dataclasses.replace(_LPCSM, learn_ratio=False),
    "sith": SITHConfig(**_SIZE, mlp_dim=256, num_filters=27, chunk_len=32),
    "sith_delta": SITHConfig(**_SIZE, mlp_dim=256, num_filters=27, chunk_len=32, delta_pulse=True),
}
# Models that predict only the last m tokens of a sequence: the tasks whose answers end it.
END_ANSWER_TASKS = ("delayed_id", "delayed_id_near", "delayed_id_repeat", "selective_copy")
LEARNING_RATES = (1e-3, 3e-3, 1e-2)  # the sweep of benchmarks/mechanisms.py
STEPS = 400


def train_config(model_name, name):
  shared = dict(steps=STEPS, learning_rate=3e-3, warmup_steps=STEPS // 10, weight_decay=0.1, log_every=50,
                eval_batches=8, run_name=f"mechanisms_{name}")
  if model_name.startswith("lpcsm"):
    # LPC-SM's ratio logit must cross its range within a short run (configs/lpcsm.py explains the 10).
    return LPCSMTrainConfig(**shared, lr_scales=("ratio_logit=10",))
  if model_name in FOX_RECIPE_LR_SCALES:
    return LRScaledTrainConfig(**shared, lr_scales=FOX_RECIPE_LR_SCALES[model_name])
  return TrainConfig(**shared)


def get_config(spec="mqar"):
  task, _, model_name = spec.partition("-")
  model_name = model_name or "fox"
  if task not in TASKS or model_name not in MODELS:
    raise ConfigError(f"mechanisms:{spec}: expected TASK[-MODEL], TASK one of {sorted(TASKS)}, "
                      f"MODEL one of {sorted(MODELS)}")
  if model_name.startswith("sith") and task not in END_ANSWER_TASKS:
    raise ConfigError(f"mechanisms:{spec}: a SITH model predicts only a sequence's last tokens; "
                      f"its tasks are {list(END_ANSWER_TASKS)}")
  return ExperimentConfig(model=MODELS[model_name], data=TASKS[task], train=train_config(model_name, spec),
                          name=f"mechanisms_{spec}")

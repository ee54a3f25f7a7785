"""Training: reusable steps (``steps``), checkpoints (``checkpoint``) and the run loop (``loop``)."""

from .loop import evaluate, train
from .steps import (TrainState, create_train_state, decay_mask, eval_step, init_params, jit_steps,
                    make_optimizer, masked_cross_entropy, train_step)

__all__ = ["TrainState", "create_train_state", "decay_mask", "eval_step", "evaluate", "init_params",
           "jit_steps", "make_optimizer", "masked_cross_entropy", "train", "train_step"]

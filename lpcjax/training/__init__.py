"""Training: reusable steps (``steps``), checkpoints (``checkpoint``) and the run (``loop``)."""

from .checkpoint import Checkpointer, has_checkpoint
from .loop import TrainingError, evaluate, train
from .steps import (TrainState, create_train_state, decay_mask, eval_step, init_params, make_optimizer,
                    state_shardings, train_step)

__all__ = ["Checkpointer", "TrainState", "TrainingError", "create_train_state", "decay_mask",
           "eval_step", "evaluate", "has_checkpoint", "init_params", "make_optimizer",
           "state_shardings", "train", "train_step"]

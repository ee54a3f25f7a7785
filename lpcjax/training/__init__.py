"""Training: reusable steps (``steps``), checkpoints (``checkpoint``), run directories
(``runs``) and the run (``loop``)."""

from .checkpoint import Checkpointer, has_checkpoint
from .loop import TrainingError, train
from .runs import RunError, num_params, read_config, restore_state
from .steps import (TrainState, create_train_state, decay_mask, eval_step, make_optimizer,
                    state_shardings, train_step)

__all__ = ["Checkpointer", "RunError", "TrainState", "TrainingError", "create_train_state", "decay_mask",
           "eval_step", "has_checkpoint", "make_optimizer", "num_params",
           "read_config", "restore_state", "state_shardings", "train", "train_step"]

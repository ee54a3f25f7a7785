"""Training: reusable steps (``steps``), checkpoints (``checkpoint``), the run directory
(``run_directory``) and the run (``loop``)."""

from .checkpoint import Checkpointer, has_checkpoint
from .loop import TrainingError, train
from .run_directory import LoadedRun, RunError, load_run, num_params, read_config, restore_state, restore_variables
from .steps import (TrainState, create_train_state, decay_mask, eval_step, make_optimizer,
                    state_shardings, train_step)

__all__ = ["Checkpointer", "LoadedRun", "RunError", "TrainState", "TrainingError", "create_train_state", "decay_mask",
           "eval_step", "has_checkpoint", "load_run", "make_optimizer", "num_params",
           "read_config", "restore_state", "restore_variables", "state_shardings", "train", "train_step"]

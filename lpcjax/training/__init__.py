"""Training: reusable steps (``steps``), checkpoints (``checkpoint``), the run directory
(``run_directory``) and the run (``loop``). Loading a run for evaluation and generation
(``load_run``) is one floor up, in ``lpcjax.runs``."""

from .checkpoint import Checkpointer, has_checkpoint
from .loop import Hook, TrainingError, train
from .run_directory import RunError, num_params, read_config, restore_state, restore_variables
from .steps import (TrainState, create_train_state, decay_mask, eval_step, make_optimizer,
                    state_shardings, train_step)

__all__ = ["Checkpointer", "Hook", "RunError", "TrainState", "TrainingError", "create_train_state", "decay_mask",
           "eval_step", "has_checkpoint", "make_optimizer", "num_params",
           "read_config", "restore_state", "restore_variables", "state_shardings", "train", "train_step"]

"""lpcjax.aot: compile for chips that are not here (an H100, a TPU v5e) on a CPU machine.

``targets`` describes the chips and makes their compile-only devices; ``attention_check``
compiles forgetting attention's kernels for them; ``compiler_reports`` reads what the compilers
say about each kernel (registers, spills, shared memory or VMEM, instruction mix);
``train_step`` compiles a whole training step. Needs ``pip install "lpcjax[aot]"`` (Python >= 3.12);
docs/compile_check.md says what is compiled for which chip.
"""

from .targets import GPU_CHIPS, TPU_CHIPS, Target, TargetError, compile_only_devices, parse_target

__all__ = ["GPU_CHIPS", "TPU_CHIPS", "Target", "TargetError", "compile_only_devices", "parse_target"]

"""Train a model of the zoo: the checkout's entry point, the same command as the installed
``lpcjax-train`` (the logic is in ``lpcjax.commands.train``; ``--help`` describes it).

  python train.py                   # tiny FoX on MQAR (CPU, a few minutes)
  python train.py --list-configs    # the named experiments
"""

from lpcjax.commands.train import main, run  # standard library only: JAX is imported later, inside main

__all__ = ["main"]

if __name__ == "__main__":
  run()

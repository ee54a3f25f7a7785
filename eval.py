"""Evaluate trained runs: the checkout's entry point, the same command as the installed
``lpcjax-eval`` (the logic is in ``lpcjax.commands.evaluate``; ``--help`` describes it).

  python eval.py --run runs/NAME
"""

from lpcjax.commands.evaluate import main, run  # standard library only: JAX is imported later, inside main

__all__ = ["main"]

if __name__ == "__main__":
  run()

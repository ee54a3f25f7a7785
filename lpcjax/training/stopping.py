"""When a run stops early: on a stop request (SIGTERM/SIGINT, to any process, agreed by all) and
after too many non-finite steps in a row (``NonfiniteGuard``)."""

import contextlib
import signal
import threading

import jax
import numpy as np
from jax.experimental import multihost_utils

from lpcjax import interrupts
from lpcjax.errors import UserError


class TrainingError(UserError, RuntimeError):
  """The run cannot continue (e.g. too many non-finite steps in a row)."""


@contextlib.contextmanager
def stop_requests():
  """Yields a dict whose "stop" turns True on SIGTERM/SIGINT (handlers restored on exit)."""
  flag = {"stop": False}
  if threading.current_thread() is not threading.main_thread():
    yield flag
    return

  def handler(signum, frame):
    flag["stop"] = True

  previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
  flag["stop"] = flag["stop"] or interrupts.requested()  # a Ctrl-C that start-up code swallowed
  try:
    yield flag
  finally:
    for sig, old in previous.items():
      signal.signal(sig, old)


def stop_agreed(stop):
  """Whether any process was asked to stop. Every process must stop at the same step (saving a
  checkpoint and leaving the loop are collective), so with several processes they agree on it
  at every step; a single process reads its own flag."""
  if jax.process_count() == 1:
    return stop["stop"]
  return bool(np.any(multihost_utils.process_allgather(np.asarray(stop["stop"]))))


class NonfiniteGuard:
  """Counts non-finite steps in a row and stops the run at ``limit``. Each step's flag is read
  one step late, after the next step is dispatched, so the host never waits for the device."""

  def __init__(self, limit, on_stop):
    self.limit, self.on_stop, self.run, self.pending = limit, on_stop, 0, None

  def push(self, step, finite):
    previous, self.pending = self.pending, (step, finite)
    if previous is not None:
      self._check(*previous)

  def flush(self):
    if self.pending is not None:
      self._check(*self.pending)
      self.pending = None

  def _check(self, step, finite):
    self.run = 0 if float(finite) else self.run + 1
    if self.run >= self.limit:
      latest = self.on_stop()
      raise TrainingError(f"{self.run} non-finite losses in a row at step {step}; stopped without "
                          f"saving (latest checkpoint: step {latest})")

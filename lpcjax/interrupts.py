"""Ctrl-C while a program starts up (imports, data, compilation): remembered, never lost.

Python turns SIGINT into a KeyboardInterrupt wherever the interpreter happens to be. When that
is a garbage-collection callback or a ``__del__`` (JAX runs one on every collection), Python
prints "Exception ignored in ..." with a traceback and carries on as if nothing had been asked.
Inside ``remembered()`` the request sticks: the handler records it before raising, and a
KeyboardInterrupt swallowed that way is not printed. Whoever runs long work inside it reads
``requested()`` at its next safe point (the trainer's ``stop_requests`` does, so a swallowed
request stops the run before its first step; eval.py checks before writing). Standard library
only: train.py and eval.py enter it before JAX is imported.
"""

import contextlib
import signal
import sys
import threading

_requested = False


def requested():
  """Whether SIGINT arrived inside ``remembered()``."""
  return _requested


@contextlib.contextmanager
def remembered():
  """SIGINT records a stop request and raises KeyboardInterrupt; the previous SIGINT handler and
  unraisable hook come back on exit, and the request is forgotten. Outside the main thread (no
  signal handlers there) a no-op."""
  global _requested
  if threading.current_thread() is not threading.main_thread():
    yield
    return

  def handler(signum, frame):
    global _requested
    _requested = True
    raise KeyboardInterrupt

  def unraisable(info):
    if _requested and issubclass(info.exc_type, KeyboardInterrupt):
      return  # swallowed by a callback, but recorded: the next safe point stops on it
    previous_hook(info)

  _requested = False
  previous_hook, previous_handler = sys.unraisablehook, signal.signal(signal.SIGINT, handler)
  sys.unraisablehook = unraisable
  try:
    yield
  finally:
    signal.signal(signal.SIGINT, previous_handler)
    sys.unraisablehook = previous_hook
    # The request belonged to this block: a later trainer in the same process (a notebook, a
    # test session) must not stop before its first step on it.
    _requested = False

"""Ctrl-C while a program starts up (imports, data, compilation): remembered, never lost.

Python turns SIGINT into a KeyboardInterrupt wherever the interpreter happens to be. When that
is a garbage-collection callback or a ``__del__`` (JAX runs one on every collection), Python
prints "Exception ignored in ..." with a traceback and carries on as if nothing had been asked.
Inside ``remembered()`` the request sticks: the handler records it before raising, and a
KeyboardInterrupt swallowed that way is not printed. Whoever runs long work inside it reads
``requested()`` at its next safe point (the trainer's ``stop_requests`` does, so a swallowed
request stops the run before its first step; eval.py checks before writing). Standard library
only: train.py and eval.py enter it before JAX is imported.

A Ctrl-C while a module is being imported is recorded and not raised. A KeyboardInterrupt
thrown out of a native extension's initialisation (jaxlib's, numpy's) leaves the library
half set up; the next import of it runs that initialisation again, and the process dies of it
(measured: SIGABRT from absl's "SetTimeZone() has already been called", or SIGSEGV). The
request is honoured at the next safe point instead: ``raise_if_requested()``, or the ones above.
A second Ctrl-C raises at once, import or not: a hung import can still be interrupted.
"""

import contextlib
import signal
import sys
import threading

_requested = False


def requested():
  """Whether SIGINT arrived inside the ``remembered()`` block that is running (False outside)."""
  return _requested


def raise_if_requested():
  """A safe point: KeyboardInterrupt if SIGINT arrived (one that an import or a callback held back)."""
  if _requested:
    raise KeyboardInterrupt


def _importing(frame):
  """Whether Python's import machinery is on the stack: a module, maybe a native one, is loading."""
  while frame is not None:
    if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
      return True
    frame = frame.f_back
  return False


@contextlib.contextmanager
def remembered():
  """SIGINT records a stop request and raises KeyboardInterrupt (held back during an import unless
  one was recorded already); the previous SIGINT handler and unraisable hook come back on exit.
  Outside the main thread (no signal handlers there) a no-op."""
  global _requested
  if threading.current_thread() is not threading.main_thread():
    yield
    return

  def handler(signum, frame):
    global _requested
    again, _requested = _requested, True
    if again or not _importing(frame):
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
    _requested = False  # the request belonged to this block: a later run in the process starts clean

"""The table of forgetting-attention backends: what each supports, and how "auto" picks one.

A backend is one file whose last line registers a ``Backend``: its function, what it supports
(platforms, head dims, dtypes, windows, pruning, grouped-query attention, the pair kernels the
context-parallel ring runs) and its priority. ``impl="auto"`` is an ordered fallback over the table: the backend of
highest priority that runs natively on this platform and supports the call, down to "xla",
which supports everything everywhere (tokamax's ``IMPLEMENTATIONS``, fla's
``BaseBackend(is_available, priority)``). ``unsupported`` answers the same question for a
config check, as a one-line reason, before anything is traced.
"""

import dataclasses
import os
import sys
from typing import Callable, NamedTuple, Optional

import jax.numpy as jnp

from .target import target_platform


class PairKernels(NamedTuple):
  """The kernels of one (query chunk, key chunk) pair that the context-parallel ring combines
  (``kernels/context_parallel.py``), all on heads-major chunks: q [B, HQ, Tq, D], k, v
  [B, H, Tk, D]; c_q, c_k (decay.TwoFloat) and seg_q, seg_k [B, HQ, T*]; thr [B, HQ] or None;
  offsets = (the global position of q's first row, of k's first column), traced ints:

  * ``forward(q, k, v, c_q, c_k, seg_q, seg_k, thr, offsets, *static)`` -> o [B, HQ, Tq, D]
    float32 and lse [B, HQ, Tq] in natural units (a row that sees no key: o = 0, lse = -inf);
  * ``row_term(..., offsets, do, lse, *static)`` -> this pair's part of delta [B, HQ, Tq];
  * ``backward_dq(..., offsets, do, lse, delta, *static)`` -> dq float32, not yet times sm_scale;
  * ``backward_dkv(...)`` (the same arguments) -> dk (not yet times sm_scale), dv float32
    [B, H, Tk, D] summed over each group, dc [B, HQ, Tk];
  * ``block_sizes(block_sizes or None, chunk_len, head_dim, dtype)`` -> the fitted ``BlockSizes``
    the kernels run; the ring pads each chunk to a multiple of its largest.

  ``static`` = (sm_scale, fitted BlockSizes, window, interpret); lse and delta are the rows'
  totals over every key chunk (the ring's merge)."""

  forward: Callable
  row_term: Callable
  backward_dq: Callable
  backward_dkv: Callable
  block_sizes: Callable


@dataclasses.dataclass(frozen=True)
class Backend:
  """``attention(q, k, v, log_fgate, segment_ids, sm_scale, block_sizes, interpret, **options)``
  on prepared inputs (``checks.prepare_segments``); ``options`` holds ``window`` and
  ``prune_threshold`` only when set, so a backend without them need not take them.

  * ``platforms``: the platforms it runs on compiled (``target.target_platform()``: this
    machine's, or the absent chip an ahead-of-time compile targets); ``interpretable``:
    it also runs elsewhere with ``interpret=True`` (Pallas), slowly, for tests.
  * ``head_dims``, ``dtypes`` (names of q's dtype): None for any.
  * ``window``, ``pruning``: whether it takes sliding windows and tile pruning (a backend
    without pruning computes every tile: exact, which pruning only approximates).
  * ``gqa``: whether k, v may have fewer heads than q (grouped-query attention, gqa.py),
    read from the shared head without repeating K/V in memory.
  * ``pair_kernels``: ``PairKernels`` if the ring can run it; None: no context parallelism.
  * ``priority``: "auto" tries higher first; None: never picked by "auto" (only by name).
  * ``available()``: whether its optional dependencies are installed.
  * ``suite_skips``: {test group: why}, groups of the shared test suite
    (tests/kernels/test_forgetting_attention.py) it sits out, and where it is tested instead.
  """

  name: str
  attention: Callable
  platforms: tuple[str, ...] = ("cpu", "gpu", "tpu")
  interpretable: bool = False
  head_dims: Optional[tuple[int, ...]] = None
  dtypes: Optional[tuple[str, ...]] = None
  window: bool = True
  pruning: bool = True
  gqa: bool = True
  pair_kernels: Optional[PairKernels] = None
  priority: Optional[int] = None
  available: Callable[[], bool] = lambda: True
  suite_skips: dict = dataclasses.field(default_factory=dict)

  def unsupported(self, head_dim=None, dtype=None, window=None, context_parallel=False, kv_group=None):
    """Why this backend cannot run the call, in one line, or None; unknown arguments (None)
    are not checked. ``kv_group``: query heads per key/value head (> 1: grouped-query)."""
    prefix = f"impl={self.name!r}"
    if head_dim is not None and self.head_dims is not None and head_dim not in self.head_dims:
      return f"{prefix} supports head_dim in {self.head_dims}, got {head_dim}"
    if dtype is not None and self.dtypes is not None and jnp.dtype(dtype).name not in self.dtypes:
      return f"{prefix} supports dtypes {self.dtypes}, got {jnp.dtype(dtype).name}"
    if window is not None and not self.window:
      return f"{prefix} has no sliding window"
    if kv_group is not None and kv_group > 1 and not self.gqa:
      return f"{prefix} has no grouped-query attention (num_kv_heads < num_heads)"
    if context_parallel and self.pair_kernels is None:
      able = [b.name for b in _BACKENDS.values() if b.pair_kernels is not None]
      return f"{prefix} has no context-parallel path; backends with one: {', '.join(able)}"
    return None

  def runs_natively(self):
    return target_platform() in self.platforms and self.available()

  def runs_here(self):
    """Compiled, or interpreted (then pass ``interpret=True``): what the test suite can run."""
    return self.available() and (self.interpretable or target_platform() in self.platforms)


_BACKENDS = {}
_SOURCES = {}  # name -> {"module", "file"} that registered it


def register_backend(backend):
  """Add ``backend`` (a ``Backend``) to the table; it takes part in "auto" if it has a priority.
  Registering a name again replaces the entry (a user's build of a kernel, say). The calling
  module is remembered (``source_of``): a run trained with a backend of one's own records it,
  so that a fresh eval.py imports it before checking ``model.attention_impl``."""
  if not isinstance(backend, Backend):
    raise TypeError(f"register_backend takes a Backend, got {type(backend).__name__}")
  module = sys._getframe(1).f_globals.get("__name__", "")
  file = getattr(sys.modules.get(module), "__file__", None)
  _BACKENDS[backend.name] = backend
  _SOURCES[backend.name] = {"module": module, "file": os.path.abspath(file) if file else None}
  return backend


def source_of(name):
  """{"module", "file"}: where backend ``name`` was registered (None for "auto" or an unknown name)."""
  return dict(_SOURCES[name]) if name in _SOURCES else None


def ordered_backends():
  """The registered backends, highest priority first (those "auto" never picks last)."""
  return sorted(_BACKENDS.values(), key=lambda b: (b.priority is None, -(b.priority or 0), b.name))


def available_impls():
  return ("auto",) + tuple(_BACKENDS)


def get(name):
  if name not in _BACKENDS:
    raise ValueError(f"forgetting_attention: unknown impl {name!r}; choose one of {available_impls()}")
  return _BACKENDS[name]


def resolve(impl, head_dim=None, dtype=None, window=None, context_parallel=False, kv_group=None):
  """The Backend that runs ``impl``: by name (a ValueError naming the constraint when it cannot
  run the call), or for "auto" the first of ``ordered_backends()`` with a priority that runs natively
  here and supports the call."""
  if impl == "auto":
    for backend in ordered_backends():
      if backend.priority is not None and backend.runs_natively() and backend.unsupported(
          head_dim, dtype, window, context_parallel, kv_group) is None:
        return backend
    raise ValueError("forgetting_attention: no registered backend supports this call")  # "xla" always does
  backend = get(impl)
  problem = backend.unsupported(head_dim, dtype, window, context_parallel, kv_group)
  if problem:
    raise ValueError(f"forgetting_attention: {problem}")
  return backend


def platform_problem(impl):
  """Why backend ``impl`` cannot run compiled on this machine, in one line, or None ("auto"
  and unknown names: None; ``unsupported`` answers for those). For the trainer's start: a
  config may be written anywhere, but a run runs here."""
  if impl == "auto" or impl not in _BACKENDS or _BACKENDS[impl].runs_natively():
    return None
  backend, here = _BACKENDS[impl], target_platform()
  why = (f"runs on {' or '.join(backend.platforms)}" if here not in backend.platforms
         else "needs a package that is not installed here")
  able = ", ".join(["auto", *(b.name for b in ordered_backends() if b.runs_natively())])
  return f"impl={impl!r} {why}, and this machine is {here}; backends that run here: {able}"


def unsupported(impl, head_dim=None, dtype=None, window=None, context_parallel=False, kv_group=None):
  """The one-line reason ``impl`` cannot run such calls (for a config check), or None. The
  platform is not checked: a config is written on one machine and run on another."""
  if impl == "auto":
    ring = any(b.pair_kernels is not None and b.priority is not None for b in _BACKENDS.values())
    return None if ring or not context_parallel else "no registered backend has a context-parallel path"
  if impl not in _BACKENDS:
    return f"must be one of {sorted(available_impls())}, got {impl!r}"
  return _BACKENDS[impl].unsupported(head_dim, dtype, window, context_parallel, kv_group)

"""Forgetting attention for Hopper (sm_90) in Pallas Mosaic GPU: ``impl="mosaic_gpu"``.

The GPU path JAX now maintains (Pallas' Triton lowering is deprecated): every matmul of a tile
on wgmma (operands in shared memory; on the hardware-only path, ``impl="mosaic_gpu_hw"``, P from
registers), tiles brought in by TMA bulk copies into a ring of SMEM stages completed on
mbarriers, and warpgroup specialization: in the forward one memory warpgroup issues the K/V/c
copies while two compute warpgroups (64 query rows each, 128 per CTA) run the online softmax;
in the one-kernel backward (``Version.fused_backward``) one issues the Q/dO copies while two
split each tile's matmuls by role. docs/kernels_mosaic_gpu.md has the design, the budgets and the limits.

Same algorithm and contracts as pallas_gpu.py (the ``GpuKernels`` of gpu_calls.py, through the
shared custom_vjp of vjp.py): base-2 logits, c = cumsum log f as decay.py's two float32 parts
whose difference (hi_i - hi_j) + (lo_i - lo_j) is built in the accumulator's layout from a row
vector and a column vector (never a [T, T] array), then scaled by log2 e (version 2 folds it:
one FMA's addend and a term of the running maximum or lse, ``Version.folded_decay``); the forward writes o
and the base-2 lse; the backward runs a dQ kernel per query block and a dK/dV/dc kernel per key
block (dc_j = -sum_i dS_ij), or one kernel per key block that also adds dQ's shares into HBM
(``_fused_sweep_call``), and for bf16/fp16 (version 1) a row-term kernel (delta) on the dQ
kernel's tiles, or (version 2) reads delta off o's two parts (row_term.py). Causal, segment ids
(hard cuts arrive as segments, checks.py), sliding windows (masked, and the sweeps start and end
where the band does), grouped-query attention (the kernels pick K/V head h // G; dK/dV are
written per query head and summed per group).

Pruning (``prune_epsilon``): a tile whose decay bounds its weight below the threshold
(pruning.py, on the high parts of c) is skipped: in the forward by a ``lax.cond`` around its two
matmuls, in the backward sweeps (version 2) by their bounds (the one-kernel backward tests each
tile); the backward's tiles are 64 x 64 and the forward tests each block of 64 keys of its
tiles the same way (masking a pruned prefix of a 128-key tile: ``_pruned_prefix``), so the
backward skips exactly the forward's pruned pairs.

Two versions from this one source (``Version``): ``impl="mosaic_gpu"`` is version 2 (interior
tiles skip the masks; pruning moves the backward's bounds; no row-term kernel, the forward run
for a gradient writing o in two parts; dQ, dK and dV accumulated in place across their sweeps),
``impl="mosaic_gpu_v1"`` version 1, kept by name to compare until a GPU times both
(benchmarks/mosaic_gpu_static.py compares their compiled code now), ``impl="mosaic_gpu_fused"``
version 2 with its backward in one kernel (``Version.fused_backward``), and ``impl="mosaic_gpu_hw"``
that with what only the hardware runs (``Version.hardware_only``), both by name until a GPU has
checked them.

Not yet: the context-parallel ring (no pair kernels), float32 inputs (wgmma has no
full-precision float32), head dims other than 64 and 128.

q, k, v, dO and the outputs stay in the caller's [B, T, H, D]: each TMA copy reads or writes a
box of one head in place (``_head``: a 4-D tensor map, rows strided by H * D), so no
heads-major copy is made on either side of a kernel. The per-position vectors (c's parts, ids,
lse, delta, dc) are [B * H, T].

Tested on CPU in JAX's Mosaic GPU interpreter (``interpret=True``: jax >= 0.11.2's
``InterpretGPUParams``; ``DETECT_RACES`` turns on its race detector), which simulates SMEM,
TMA, barriers and wgmma but not their layouts or timing; what it cannot show is in the docs.
"""

import dataclasses
import functools
import math
import os

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from .backends import Backend, register_backend
from .target import compute_capability, ptxas_version, target_platform
from .block_sizes import BlockSizes
from .gpu_calls import LOG2_E, GpuKernels, Shapes, grad_scale, single_device

try:  # Mosaic GPU's Pallas API as this module uses it is jax >= 0.11's
  from jax.experimental.pallas import mosaic_gpu as plgpu
  _AVAILABLE = hasattr(plgpu, "InterpretGPUParams") and hasattr(plgpu, "emit_pipeline_warp_specialized")
except ImportError:  # pragma: no cover
  plgpu, _AVAILABLE = None, False

HEAD_DIMS = (64, 128)
DTYPES = ("bfloat16", "float16")
WG_ROWS = 64  # query rows per compute warpgroup: wgmma's M
COMPUTE_WGS = 2  # the forward's compute warpgroups (a third issues the copies)
TILES = BlockSizes(block_q=WG_ROWS * COMPUTE_WGS, block_k=64, block_q_dkv=64, block_k_dkv=64,
                   block_q_dq=64, block_k_dq=64)
STAGES = 2  # SMEM stages of the K/V ring
WIDE_KEYS = 128  # the forward's key tile where SMEM allows (Version.wide_forward_keys, forward_key_tile)
SMEM_BYTES = 227 * 1024  # an H100's shared memory per block
# what Mosaic GPU asks beyond a kernel's scratch and its pipeline's buffers (alignment, its
# barriers, the scratch of its cross-warp reductions): 2.5 to 4 KiB in the forwards compiled for
# sm_90a, so the larger is allowed
MOSAIC_SMEM_EXTRA = 4 * 1024
# Version.folded_decay measures each position's decay from its block's anchor, the block's middle
# position (no position is more than half a block's decay from it), in blocks of ANCHOR_BLOCK (the
# forward's wide key tiles read a second vector measured in blocks of their own width); every side
# of every tile is one such block, so that one gap (two anchors) serves a whole tile
ANCHOR_BLOCK = 64
ANCHOR = ANCHOR_BLOCK // 2
assert {WG_ROWS, TILES.block_k, TILES.block_q_dq, TILES.block_k_dq, TILES.block_q_dkv, TILES.block_k_dkv} == {
    ANCHOR_BLOCK}
# o's second part (Version.two_part_output) is bf16 for fp16 inputs too: o - fp16(o) is about
# 2^-11 |o| and falls into fp16's subnormals where |o| is below about 0.06
O_LO_DTYPE = jnp.bfloat16
DETECT_RACES = False  # the interpreter's race detector (tests turn it on)


@dataclasses.dataclass(frozen=True)
class Version:
  """What the kernels' versions do differently, from one source (docs/kernels_mosaic_gpu.md).

  * ``unmasked_interior``: a tile every pair of which is visible (below the diagonal, inside the
    window, one segment: a test of its corners) skips the masks' iotas, compares and selects, in
    the forward, the dQ and the row-term kernels, and at D = 64 in the key sweeps (dK/dV and the
    one-kernel backward: ``_key_sweep_skips_masks``).
  * ``heavy_first``: the query blocks with the most key blocks (the last, under the causal mask)
    are launched first, so that the short ones fill the last wave (forward, dQ, row term; the
    dK/dV kernel's key blocks already come heaviest first).
  * ``pruned_bounds``: pruning moves the backward sweeps' bounds (the pruned tiles of a block
    are a prefix of its key blocks and a suffix of its query blocks, c being monotone) instead of
    testing each tile inside the loop, so a pruned tile costs no copy and no pipeline step (not
    in the one-kernel backward of ``fused_backward``, which tests each tile: ``_fused_sweep_call``).
  * ``two_part_output``: the forward run for a gradient multiplies V by P's rounding to the
    inputs' dtype and by its rounding residual (a third matmul per tile) and writes o as two parts,
    o + o_lo (o_lo in bf16 whatever the inputs' dtype); the backward reads the row term
    delta_i = dO_i . (o_i + o_lo_i) off them and the dQ kernel adds dS's row sums to dc, which
    keeps d log f within a few times the recomputed row term's error (row_term.py), so there is
    no row-term kernel: 7 matmul units per tile backward instead of 9, 3 forward (2 without a
    gradient).
  * ``in_place_accumulators``: dQ, and dK and dV, accumulate in wgmma accumulators that live
    across the sweep (``_accumulate``) instead of a fresh one per tile added to a carried value:
    no register copy of the product and no add per element (the step waits for the last product
    before its stage is refilled).
  * ``hardware_only``: constructs JAX's Mosaic GPU interpreter cannot run (docs): wgmma's A
    operand (P and its residual in the forward; in the backward dS, or with ``fused_backward``
    P^T) from registers instead of through SMEM (``_a_operands``), and
    the forward's rescaled accumulator handed back to wgmma by ``ACC.init`` instead of a fresh
    one added to it (``_rescaled_products``); those operands get no SMEM tiles
    (``_operand_tiles``), and its kernels are named ``..._hw`` (``_named``). No interpret mode:
    compiled ahead of time in CI, its numerics checked only on a GPU (benchmarks/gpu_check.sh's
    first step).
  * ``approx_math`` (Mosaic GPU's compiler option): exp2 and log2 as the bare MUFU instructions
    (``ex2.approx.ftz``, ``lg2.approx.ftz``), without the denormal handling ptxas adds to the
    default lowering's ``ex2.approx.f32`` (three instructions per element): 96 fewer per trip of
    a 64 x 64 tile loop's exp (docs). What changes: a weight below 2^-126
    of its row's running maximum (forward) or of 2^lse (backward) becomes 0, and lse is within
    about 2^-22. On the hardware path only, as JAX's interpreter computes both exactly: only a
    GPU shows the difference.
  * ``fused_backward`` (with ``two_part_output``): the whole backward in one kernel
    (``_fused_sweep_call``), five matmul units a tile instead of seven: per key block, two compute
    warpgroups split each tile's matmuls by role (S, P, dV and dQ on one; dP, dS and dK on the
    other) and dQ's shares are reduce-added into float32 in HBM, so dQ's rounding depends on the
    order the key blocks finish (not deterministic; version 2's two kernels are). Named on the
    tested path (``impl="mosaic_gpu_fused"``), and the hardware path's backward.
  * ``folded_decay``: the decay costs one FMA per element instead of five operations (two
    subtractions and an addition of c's parts, a multiply and an FMA). Each block of 64 positions
    has an anchor (its position ``ANCHOR``) and each position carries, instead of c's low part,
    its decay from its block's anchor, e_t = (c_t - hi_anchor) log2 e (``_in_block_decay2``:
    float32, a small number). A tile's decay is then (c_i - c_j) log2 e = gap + e_i - e_j, gap =
    (hi at the queries' anchor - hi at the keys' anchor) log2 e (two scalar reads). The columns'
    part (the side the sweep moves along) is the logits' FMA's addend; the rows' part, with the
    gap, joins what every element subtracts anyway, the running maximum (forward) or lse
    (backward): two values a thread per tile (``_probabilities``). Error: a weight's logit rounds
    at the size of those terms, up to the decay across half a block plus |scale q.k|, where the
    unfolded difference rounds at |c_i - c_j|: so the decay inside a block sets it, not |c|.
    Measured (fp16, T = 512, D = 64, against float64; benchmarks/mosaic_gpu_decay_fold.py,
    docs/kernels_mosaic_gpu.md): the same with gates near 1; with log f in [-4, -1] d log f 6.0e-6
    with 64-key forward tiles and 1.1e-5 with the 128-key ones of ``wide_forward_keys`` (unfolded
    1.2e-6); one step of -1e4 inside a block 1.7e-4 (64 keys) and 7.2e-4 (128 keys, with dv at
    7.4e-4 against its fp16 rounding's 4.1e-4).
  * ``wide_forward_keys``: the forward's key tiles are 128 wide where its two-part build's SMEM
    allows (``forward_key_tile``: D = 64 on every path, D = 128 on the hardware path, whose P
    needs no SMEM tile), 64 elsewhere: each wgmma twice as wide, the running maximum's and the
    accumulator's rescale once per 128 keys, and less SMEM read per matmul unit (the tile of Q
    is read once per 128 keys). With ``folded_decay`` the keys' second vector is measured from
    the middle of their 128-block: up to 64 positions' decay instead of 32 (the error, measured:
    docs/kernels_mosaic_gpu.md).
  * ``taking_turns``: the forward's two compute warpgroups issue their products in turns (FA3's
    ping-pong schedule, ``_Turns``): one warpgroup's softmax runs while the other's products
    keep the tensor cores busy, instead of both issuing at once and both then waiting. On the
    hardware path only, with its other constructs awaiting a GPU: it costs 5 % (edge tiles) to
    9 % (interior ones) more instructions in the forward's loop (the turns' waits and their
    barriers' phases), which a compiler count cannot weigh against the overlap it buys;
    gpu_check.sh times it against the same path without (docs/kernels_mosaic_gpu.md).
  * ``early_key_release``: the forward's stages are waited for and handed back by hand
    (``_Stage``: a produced and a consumed barrier per input, where the pipeline otherwise keeps
    one of each for all): K's and the keys' vectors' are waited for at the step's start and V's
    only before P V, and K's goes back as soon as S is in the registers, the vectors' once P is,
    V's after P V. So the copying warpgroup refills K with the block two steps on while P V runs,
    and a step's S need not wait for its V to land (FlashAttention-3's separate K and V
    pipelines). On the hardware path only, with its other constructs awaiting a GPU: three waits
    and three arrivals a step instead of one each, 24 to 43 more instructions a trip of the
    forward's loop, which the issue's cost model can only charge; gpu_check.sh times it against
    the same path without (``mosaic_gpu_hw_no_early_release``). The interpreter runs it (tested
    on the tested path with its race detector).
  """

  name: str
  unmasked_interior: bool
  heavy_first: bool
  pruned_bounds: bool
  two_part_output: bool
  in_place_accumulators: bool
  hardware_only: bool = False
  approx_math: bool = False
  fused_backward: bool = False
  folded_decay: bool = False
  wide_forward_keys: bool = False
  taking_turns: bool = False
  early_key_release: bool = False


V1 = Version("mosaic_gpu_v1", unmasked_interior=False, heavy_first=False, pruned_bounds=False,
             two_part_output=False, in_place_accumulators=False)  # to compare
V2 = Version("mosaic_gpu", unmasked_interior=True, heavy_first=True, pruned_bounds=True, two_part_output=True,
             in_place_accumulators=True, folded_decay=True, wide_forward_keys=True)
# by name, until a GPU checks it
# its backward tests each tile for pruning (``_fused_sweep_call``): no bounds to build
V2_FUSED = dataclasses.replace(V2, name="mosaic_gpu_fused", fused_backward=True, pruned_bounds=False)
V2_HARDWARE = dataclasses.replace(V2_FUSED, name="mosaic_gpu_hw", hardware_only=True, approx_math=True,
                                  taking_turns=True, early_key_release=True)
VERSIONS = {version.name: version for version in (V1, V2, V2_FUSED, V2_HARDWARE)}


def available():
  return _AVAILABLE


def on_gpu():
  """Whether the kernels can be built: on a GPU, or compiling for an absent one (target.py)."""
  return target_platform() == "gpu"


# ptxas from CUDA 12.8.0 up to 12.9.1 (exclusive) miscompiles the iota comparisons that causal
# masks are built from; JAX's own Hopper attention (attention_mgpu) refuses causal masks there.
# It tests the CUDA runtime's version; the kernels here are assembled by the ptxas that XLA
# finds (target.ptxas_version), so that is the one tested. CUDA 12.8.0's ptxas reports V12.8.61 and
# 12.9.1's V12.9.86.
MISCOMPILING_PTXAS = ((12, 8, 0), (12, 9, 86))


def _interpreter_threads():
  """How many XLA computations JAX's interpreter can run at once here, as measured on a 2-core
  machine: they hang with 1 or 2 host devices and run with 3 (measured: the one-kernel backward,
  and version 2's forward with its 128-key tiles; the same forward with 64-key tiles ran at
  T = 1024), so the larger of the CPUs this
  process may use and the host devices (a bound from that one machine, not XLA's rule)."""
  cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
  if cpus >= 3:
    return cpus
  try:
    return max(cpus, jax.local_device_count("cpu"))
  except RuntimeError:  # no CPU backend in this process
    return cpus


def check_runnable(interpret, version=V2):
  if interpret and version.hardware_only:
    raise ValueError(f"forgetting_attention: impl={version.name!r} uses what JAX's Mosaic GPU interpreter "
                     f"cannot run (wgmma operands in registers, ACC.init): no interpret mode; use "
                     f"impl='mosaic_gpu' there")
  if interpret and _interpreter_threads() < 3:
    raise ValueError(f"forgetting_attention: impl={version.name!r} under interpret=True runs each kernel's three "
                     f"warpgroups as XLA computations at once, waiting on each other, and XLA's CPU client "
                     f"runs fewer at once on this machine (it would hang); set XLA_FLAGS="
                     f"--xla_force_host_platform_device_count=3 or more before JAX starts")
  if interpret:
    return
  if not on_gpu():
    on_cpu = "use impl='xla'" if version.hardware_only else (
        "pass interpret=True (slow, for tests, jax >= 0.11.2) or use impl='xla'")
    raise ValueError(f"forgetting_attention: impl={version.name!r} needs a Hopper GPU; on CPU {on_cpu}")
  capability = compute_capability()
  if capability is not None and not capability.startswith("9."):
    raise ValueError(f"forgetting_attention: impl={version.name!r} runs on Hopper (sm_90: wgmma, TMA); this GPU "
                     f"is sm_{capability.replace('.', '')}: use impl='pallas'")
  ptxas = ptxas_version()
  if ptxas is not None and MISCOMPILING_PTXAS[0] <= ptxas < MISCOMPILING_PTXAS[1]:
    raise ValueError(f"forgetting_attention: impl={version.name!r} is refused with ptxas "
                     f"{'.'.join(map(str, ptxas))}, which miscompiles causal masks (CUDA 12.8.0 to 12.9.0); "
                     f"install nvidia-cuda-nvcc-cu12>=12.9.86 or use impl='pallas'")


def fit_block_sizes(block_sizes, seq_len, head_dim, dtype=None, version=V2):
  """The kernels' fixed tiles (their shapes follow wgmma's and the warpgroups'; the forward's key
  tile, ``block_k``, is ``forward_key_tile``'s); other sizes are refused in one line."""
  del seq_len, dtype
  tiles = dataclasses.replace(TILES, block_k=forward_key_tile(version, head_dim))
  if block_sizes is not None and block_sizes.fitted(1 << 30) != tiles.fitted(1 << 30):
    raise ValueError(f"forgetting_attention: the Mosaic GPU kernels run fixed tiles {tiles}; got {block_sizes}")
  return tiles


def _named(body, kernel, version):
  """``body`` named forgetting_attention_mgpu_<kernel> (with "_hw" on the hardware-only path):
  the name its compiled kernel, its compiler dumps (MOSAIC_GPU_DUMP_TO) and a profile show."""
  suffix = "_hw" if version.hardware_only else ""
  body.__name__ = body.__qualname__ = f"forgetting_attention_mgpu_{kernel}{suffix}"
  return body


def _compiler_params(version):
  return plgpu.CompilerParams(approx_math=True) if version.approx_math else None


def _interpret(static):
  return plgpu.InterpretGPUParams(detect_races=DETECT_RACES) if static.interpret else None


def _smem_tiles(columns, dtype):
  """Tiling and swizzle of an SMEM tile with ``columns`` elements per row (wgmma's operand
  layout: 128-byte swizzle where a row is that wide)."""
  itemsize = jnp.dtype(dtype).itemsize
  swizzle = plgpu.find_swizzle(columns * itemsize * 8)
  return (plgpu.TilingTransform((8, swizzle // itemsize)), plgpu.SwizzleTransform(swizzle))


def _products(pairs, shape, turn=None):
  """sum of a @ b over ``pairs`` (b an SMEM operand, maybe a transposed view; a in SMEM, or in
  registers on the hardware path), accumulated by wgmma in one fresh float32 accumulator; issued
  in this warpgroup's ``turn`` (``_Turns``) where given."""
  def run(acc):
    _issued_in_turn(turn, lambda: [plgpu.wgmma(acc, a, b) for a, b in pairs])
    return acc[...]
  return pl.run_scoped(run, plgpu.ACC(shape, jnp.float32))


def _matmul(a, b, shape, turn=None):
  return _products([(a, b)], shape, turn)


def _accumulate(acc, value, a, b):
  """value + a @ b, for a sweep's accumulator: with ``acc`` (an ACC ref that lives across the
  sweep, ``_with_accumulators``) the wgmma adds into it in place and is left in flight (the
  step ends by waiting for it: ``_in_flight_done``), and ``value`` stays None; without, the
  product goes through a fresh accumulator into ``value``."""
  if acc is None:
    return value + _matmul(a, b, value.shape)
  plgpu.wgmma(acc, a, b)
  return None


def _in_flight_done(in_place, carry):
  """``carry``, after waiting for every wgmma left in flight by ``_accumulate``: the pipeline
  refills the step's stage (the K or Q tile the product reads) when the step returns, and the
  next step rewrites the SMEM tiles it reads (dS, P^T). Waiting here, rather than releasing the
  stage a step late, keeps the prefetch two tiles ahead; the next step's first product would
  wait for it anyway. (Free where nothing is in flight: a step a branch skipped.)"""
  if in_place:
    plgpu.wgmma_wait(0)
  return carry


def _operand_tiles(version, shape, dtype, transforms, count=1):
  """SMEM tiles for ``count`` of wgmma's A operands (``_a_operands``): none on the hardware path,
  whose A operands stay in registers."""
  return [] if version.hardware_only else [plgpu.SMEM(shape, dtype, transforms=transforms)] * count


def _a_operands(values, dtype, tiles):
  """wgmma's A operands from float32 ``values``, in ``dtype``: stored to ``tiles`` (one fence for
  them all), which are returned; with no tiles (``_operand_tiles`` on the hardware path), in
  registers."""
  if not tiles:
    return [value.astype(dtype) for value in values]
  for value, tile in zip(values, tiles, strict=True):
    tile[...] = value.astype(tile.dtype)
  plgpu.commit_smem()
  return list(tiles)


class _Turns:
  """``Version.taking_turns``: the compute warpgroups issue their products in turns, a token
  passed between them on two one-arrival barriers (``barriers.at[w]``: warpgroup w's turn). A
  warpgroup waits for the token, issues, and hands it over at once, before waiting for its
  products: so warpgroup 0's S of a step runs while warpgroup 1 computes its P, and the other
  way round. Each warpgroup takes two turns a step (S, then P V), a skipped tile too, so the
  token alternates; warpgroup 1 hands it over once before the sweep, so warpgroup 0 goes first,
  and warpgroup 0 takes it back once after the sweep, so every arrival is waited for."""

  def __init__(self, barriers, wg):
    self.barriers, self.wg = barriers, wg

  def wait(self):
    plgpu.barrier_wait(self.barriers.at[self.wg])

  def hand_over(self):
    plgpu.barrier_arrive(self.barriers.at[1 - self.wg])


class _Stage:
  """One input's pipeline stage with its own barriers (``Version.early_key_release``): ``ready``
  waits for its copy to land, ``release`` hands the tile back to the copying warpgroup. Both do
  nothing where the pipeline keeps one barrier for all inputs (``barriers`` None) and waits and
  releases around the whole step itself. Each step must wait for and release every stage once,
  in every branch: the barriers' phases are counted per wait."""

  def __init__(self, barriers=None):
    self.produced, self.consumed = barriers or (None, None)

  def ready(self):
    if self.produced is not None:
      plgpu.barrier_wait(self.produced)

  def release(self):
    if self.consumed is not None:
      plgpu.barrier_arrive(self.consumed)


def _issued_in_turn(turn, issue):
  """``issue()`` (wgmmas, left in flight), in ``turn`` if there is one."""
  if turn is not None:
    turn.wait()
  issue()
  if turn is not None:
    turn.hand_over()


def _rescaled_products(acc, scale, pairs, version, turn=None):
  """acc times ``scale`` (a row vector) plus the sum of a @ b over ``pairs``: on the hardware path
  wgmma adds into the rescaled acc itself (``ACC.init``), else into a fresh accumulator added to it;
  issued in ``turn`` where given."""
  acc = acc * _across(scale, acc.shape, 0)
  if not version.hardware_only:
    return acc + _products(pairs, acc.shape, turn)

  def run(ref):
    _issued_in_turn(turn, lambda: [plgpu.wgmma(ref, a, b) for a, b in pairs])
  return pl.run_state(run)(plgpu.ACC.init(acc))


def _with_accumulators(sweep, shapes, in_place):
  """``sweep(*accs)`` with an in-place float32 ACC of each of ``shapes`` (``in_place``), or with
  None for each (the sweep then carries its sums as values)."""
  if not in_place:
    return sweep(*(None for _ in shapes))
  return pl.run_scoped(sweep, *(plgpu.ACC(shape, jnp.float32) for shape in shapes))


def _rows(ref, axis):
  """A per-position vector from SMEM in the accumulator's row (``axis`` 0) or column layout."""
  return plgpu.load(ref, layout=plgpu.Layout.WGMMA.reduce(1 - axis))


def _across(x, shape, axis):
  return lax.broadcast_in_dim(x, shape, [axis])


class _Positions:
  """One side of a tile (its rows, ``axis`` 0, or columns, 1): first position and the SMEM
  vectors of c's high part, its second vector (decay.py's low part, or with
  ``Version.folded_decay`` the decay from the block's anchor, ``_in_block_decay2``) and the
  segment ids (and the refs, for scalar reads)."""

  def __init__(self, start, hi, second, seg, axis, anchor=None):
    self.start, self.axis, self.hi_ref, self.seg_ref, self.size = start, axis, hi, seg, hi.shape[0]
    # c's high part at the anchor of the block the side is (Version.folded_decay: its middle),
    # read where the side is built unless given: before the sweep for dQ's rows and dK/dV's keys,
    # every step for the forward's rows (rebuilt in each step) and for the one-kernel backward's
    # keys (read once by the kernel)
    self.anchor = hi[self.size // 2] if anchor is None else anchor
    self.hi, self.second, self.seg = _rows(hi, axis), _rows(second, axis), _rows(seg, axis)
    self.first_kept = None  # the forward's wide key tiles: the first key pruning keeps (_pruned_prefix)

  def positions(self):
    """The side's positions, a vector in its layout."""
    layout = plgpu.Layout.WGMMA.reduce(1 - self.axis)
    return plgpu.broadcasted_iota(jnp.int32, (self.size,), 0, layout=layout) + self.start


def _interior(queries, keys, window):
  """Whether every (query, key) pair of the tile is visible: its last key at or before its first
  query, its last query within the window of its first key, and one segment. The kernels' segment
  ids never fall along the sequence (checks.prepare_segments' cumulative sum, and ``_prepared``
  carries it over the padding), so equal ids at the four ends of the two sides mean one
  segment: four scalar reads of SMEM. A wide key tile with a pruned prefix (``first_kept``) is
  not interior."""
  interior = keys.start + keys.size - 1 <= queries.start
  if window is not None:
    interior &= queries.start + queries.size - 1 - keys.start < window
  if keys.first_kept is not None:
    interior &= keys.first_kept == keys.start
  ends = [ref[index] for ref in (queries.seg_ref, keys.seg_ref) for index in (0, ref.shape[0] - 1)]
  return interior & (ends[0] == ends[1]) & (ends[1] == ends[2]) & (ends[2] == ends[3])


def _decayed_logits2(scores, queries, keys, scale2):
  """Base-2 logits of a tile before the masks: (scale q.k + c_i - c_j) log2 e, c_i - c_j from the
  two parts (decay.py)."""
  shape = scores.shape
  decay = ((_across(queries.hi, shape, queries.axis) - _across(keys.hi, shape, keys.axis))
           + (_across(queries.second, shape, queries.axis) - _across(keys.second, shape, keys.axis)))
  return scores * scale2 + decay * LOG2_E


def _masked(s, queries, keys, window):
  """``s`` with -inf where the pair is not visible: causal, same segment, inside the window."""
  shape = s.shape
  columns = keys.positions()
  if keys.first_kept is not None:  # keys pruning masks: past every query (a vector op, not per element)
    columns = jnp.where(columns >= keys.first_kept, columns, jnp.iinfo(jnp.int32).max)
  i, j = _across(queries.positions(), shape, queries.axis), _across(columns, shape, keys.axis)
  visible = (i >= j) & (_across(queries.seg, shape, queries.axis) == _across(keys.seg, shape, keys.axis))
  if window is not None:
    visible &= i - j < window
  return jnp.where(visible, s, -jnp.inf)


def _unmasked_logits2(scores, queries, keys, scale2, columns=None):
  """``_logits2`` before the masks."""
  if columns is None:
    return _decayed_logits2(scores, queries, keys, scale2)
  return scores * scale2 + _across(columns, scores.shape, 1)


def _logits2(scores, queries, keys, scale2, window, masks_only_where_needed=False, columns=None):
  """Base-2 logits of a tile, -inf where masked. With ``masks_only_where_needed`` an interior
  tile (``_interior``) skips the masks. With ``columns`` (``Version.folded_decay``) the decay is
  that vector along the columns, scale q.k + columns in one FMA: the rows' part of the decay is
  left to the caller (``_probabilities``)."""
  s = _unmasked_logits2(scores, queries, keys, scale2, columns)
  if not masks_only_where_needed:
    return _masked(s, queries, keys, window)
  return lax.cond(_interior(queries, keys, window), lambda s: s, lambda s: _masked(s, queries, keys, window), s)


def _gap2(queries, keys):
  """``Version.folded_decay``'s gap between a tile's two anchors, (hi at the queries' anchor - hi
  at the keys' anchor) log2 e: two scalar SMEM reads, one rounding of their difference (none where
  they are within a factor 2). The decay is then gap + e_i - e_j."""
  return (queries.anchor - keys.anchor) * LOG2_E


def _probabilities(scores, queries, keys, lse2, scale2, window, version, masks_only_where_needed=False):
  """P of a tile in the backward, exp2(logits - lse), from its scores (S with the queries as rows,
  or S^T with the keys as rows: the backward's sweeps run both) and the queries' base-2 lse (a
  vector along the queries). Folded (``Version.folded_decay``): the columns' part of the decay
  goes into the logits' FMA, and the rows' part with the gap (two values a thread) into the
  vector every element subtracts: no per-element work beyond the FMA and that subtraction."""
  if not version.folded_decay:
    s = _logits2(scores, queries, keys, scale2, window, masks_only_where_needed)
    return jnp.exp2(s - _across(lse2, s.shape, queries.axis))
  gap = _gap2(queries, keys)
  if queries.axis == 0:  # rows: the queries; exp2(s - e_j - (lse_i - e_i - gap))
    columns, rows = -keys.second, lse2 - queries.second - gap
  else:  # rows: the keys; exp2(s + e_i - lse_i - (e_j - gap))
    columns, rows = queries.second - lse2, keys.second - gap
  s = _logits2(scores, queries, keys, scale2, window, masks_only_where_needed, columns)
  return jnp.exp2(s - _across(rows, s.shape, 0))


def _prunable(queries, keys, thr, last=None):
  """Whether pruning may skip a tile: pruning.py's bound, max over the rows of c minus min over
  the columns below the threshold ``thr`` (a scalar), on the high parts of c (a tile holding a
  diagonal element never passes it). c is non-increasing (log f <= 0; rounding to hi keeps the
  order), so the max is the first row's and the min the last column's: two scalar SMEM reads.
  (A reduction of the layout'd vectors would go through a scratch slot that the forward's two
  compute warpgroups share, unsynchronized between them.)"""
  last = keys.hi_ref.shape[0] - 1 if last is None else last  # or the last column of a prefix
  return queries.hi_ref[0] - keys.hi_ref[last] < thr


def _pruned_prefix(queries, keys, thr):
  """The first key of a wide key tile (the forward's, ``forward_key_tile``) that pruning keeps,
  tested per ANCHOR_BLOCK of keys as the backward's tiles are, so that the forward skips exactly
  the backward's pruned tiles: the tile is skipped where its last block may be (``_prunable``),
  and the blocks before the first kept one are masked (c being non-increasing, they are a
  prefix). Their values are still read and multiplied by 0."""
  first_kept = keys.start
  for block in range(1, keys.size // ANCHOR_BLOCK):  # the prefix of ``block`` blocks, by its last column
    pruned = _prunable(queries, keys, thr, last=block * ANCHOR_BLOCK - 1)
    first_kept = jnp.where(pruned, keys.start + block * ANCHOR_BLOCK, first_kept)
  return first_kept


def _unless_pruned(prune, queries, keys, thr, update, carry):
  """``update(carry)``, or ``carry`` when pruning is on and may skip the tile."""
  if not prune:
    return update(carry)
  return lax.cond(_prunable(queries, keys, thr), lambda carry: carry, update, carry)


def _forward_takes_turns(version, head_dim, two_part):
  """Whether the forward's warpgroups take turns (``Version.taking_turns``): everywhere but the
  hardware path's two-part forward at D = 128, where P's two register operands and the
  accumulator fill the registers at P V's turn and its wait spilled 8 B (plain causal;
  benchmarks/mosaic_gpu_static.py)."""
  return version.taking_turns and not (version.hardware_only and two_part and head_dim > 64)


def _key_sweep_skips_masks(version, head_dim):
  """Whether the key sweeps (dK/dV, the one-kernel backward: S^T, keys as rows) skip the masks of
  interior tiles (``Version.unmasked_interior``): at D = 64, where their registers allow it (no
  spills, measured: version 2's dK/dV 162 registers on its interior path, 201 on its masked one);
  at D = 128 the branch spills (version 2's dK/dV 52 B, the one-kernel backward 28 B, 20 B on
  the hardware path, plain causal; benchmarks/mosaic_gpu_static.py), so every tile is masked."""
  return version.unmasked_interior and head_dim <= 64


def _launch_order(index, count, version):
  """The query block that grid point ``index`` (of ``count``) computes: the last first with
  ``version.heavy_first`` (a causal row block's work grows with its position)."""
  return count - 1 - index if version.heavy_first else index


def _key_range(first_row, rows, block, window):
  """[first, end) key blocks that rows [first_row, first_row + rows) may see."""
  end = pl.cdiv(first_row + rows, block)
  first = 0 if window is None else jnp.maximum(first_row - window + 1, 0) // block
  return first, end


def _query_range(first_key, keys, block, num_blocks, window):
  """[first, end) query blocks that see any of keys [first_key, first_key + keys)."""
  first = first_key // block
  end = num_blocks if window is None else jnp.minimum(num_blocks, pl.cdiv(first_key + keys - 1 + window, block))
  return first, end


def _from_block(first, shape, transforms=()):
  """The spec of block j + ``first`` of a [T, ...] operand: a sweep that starts at block ``first``."""
  return plgpu.BlockSpec(shape, lambda j: (j + first,) + (0,) * (len(shape) - 1), transforms=transforms)


def _key_specs(first, block, head_dim, tile):
  """K, V tiles and the columns' c hi, second vector and ids, from key block ``first`` on."""
  return ([_from_block(first, (block, head_dim), tile)] * 2 + [_from_block(first, (block,))] * 3)


def _sizes(q):
  """B * HQ, T and D of q [B, T, HQ, D]: the kernels' grid runs over (query head, block)."""
  batch, seq_len, heads, head_dim = q.shape
  return batch * heads, seq_len, head_dim


def _head(ref, bh, heads, group=1):
  """The [T, D] view of one head of a [B, T, H, D] operand, for query head ``bh`` of B * HQ (its
  K/V head where ``group`` query heads share one): TMA boxes read it in place, a row of T
  strided by H * D, so no heads-major copy of q, k, v, dO or the outputs is made."""
  return ref.at[bh // heads, :, (bh % heads) // group]


# ----------------------------------------------------------------------------- forward


def _forward_tiles(version, dtype, head_dim, bk, two_part):
  """The forward's SMEM tiles, (shape, dtype): Q's per compute warpgroup (o goes out through it
  once its last product is done), the rows' vectors (c hi, second vector, ids, threshold), lse,
  o_lo's (``two_part``), and P's (and its residual's) on the tested path."""
  tiles = [((COMPUTE_WGS, WG_ROWS, head_dim), dtype), ((COMPUTE_WGS, 4, WG_ROWS), jnp.float32),
           ((COMPUTE_WGS, WG_ROWS), jnp.float32)]
  if two_part:
    tiles.append(((COMPUTE_WGS, WG_ROWS, head_dim), O_LO_DTYPE))
  if not version.hardware_only:
    tiles += [((COMPUTE_WGS, WG_ROWS, bk), dtype)] * (1 + two_part)
  return tiles


def _forward_scratch(version, dtype, head_dim, bk, two_part, turns):
  """``_forward_tiles`` as SMEM scratch (wgmma's tiling and swizzle), with Q's barriers after lse and
  then, with ``turns``, the two of ``_Turns``."""
  # the matrices (64 rows: what wgmma and TMA read) tiled and swizzled, the vectors plain
  refs = [plgpu.SMEM(shape, kind, transforms=_smem_tiles(shape[-1], kind)) if shape[1:-1] == (WG_ROWS,)
          else plgpu.SMEM(shape, kind) for shape, kind in _forward_tiles(version, dtype, head_dim, bk, two_part)]
  turns = [plgpu.Barrier(num_arrivals=1, num_barriers=COMPUTE_WGS)] if turns else []
  return refs[:3] + [plgpu.Barrier(num_arrivals=5, num_barriers=COMPUTE_WGS)] + turns + refs[3:]


def _forward_smem(version, dtype, head_dim, bk, two_part):
  """Bytes of SMEM the forward asks: its tiles, the pipeline's STAGES of K, V and the keys' three
  vectors, and what Mosaic GPU adds (``MOSAIC_SMEM_EXTRA``)."""
  tiles = sum(math.prod(shape) * jnp.dtype(kind).itemsize
              for shape, kind in _forward_tiles(version, dtype, head_dim, bk, two_part))
  return tiles + STAGES * bk * (2 * head_dim * jnp.dtype(dtype).itemsize + 3 * 4) + MOSAIC_SMEM_EXTRA


def forward_key_tile(version, head_dim):
  """The forward's key tile: ``WIDE_KEYS`` with ``version.wide_forward_keys`` where the two-part
  forward (the larger) then fits an H100's SMEM, else 64. One width for both forwards of a head
  dim, so that the tiles reported (``fit_block_sizes``) are the ones run."""
  wide = version.wide_forward_keys and _forward_smem(version, jnp.bfloat16, head_dim, WIDE_KEYS, True) <= SMEM_BYTES
  return WIDE_KEYS if wide else TILES.block_k


def _forward_call(q, k, v, c_hi, c_lo, seg, thr, key_vectors, *, heads, group, scale2, window, prune, interpret,
                  version, bounds=None, two_part=False):
  """o [B, T, HQ, D] and base-2 lse [BH, T] from q [B, T, HQ, D], k, v [B, T, HQ/G, D] and the
  per-position vectors [BH, T] (BH = B * HQ); with ``two_part`` (``Version.two_part_output``) o, o_lo and
  lse, o + o_lo being the output of P's two parts (its rounding and the residual) times V. The key
  tile is ``forward_key_tile``'s; ``key_vectors`` [BH, 3, T] the keys' c hi, second vector
  (``c_lo``'s, or with ``folded_decay`` and wide keys, measured in blocks of the key tile's width)
  and ids, one array so that a key block's three vectors are one copy and one pipeline stage."""
  del bounds  # the forward tests each tile: its warpgroups share one key sweep (docs/kernels_mosaic_gpu.md)
  bh_count, seq_len, head_dim = _sizes(q)
  bq, bk = WG_ROWS, forward_key_tile(version, head_dim)
  tile = _smem_tiles(head_dim, q.dtype)
  turns = _forward_takes_turns(version, head_dim, two_part)

  def body(*refs):
    q_ref, k_ref, v_ref, hi_ref, lo_ref, seg_ref, thr_ref, key_vectors_ref, o_ref, *refs = refs
    o_lo_ref, lse_ref, *refs = refs if two_part else (None, *refs)
    q_s, rows_s, lse_s, q_bar, *refs = refs
    turn_bars, *refs = refs if turns else (None, *refs)
    o_lo_s, *p_tiles = refs if two_part else (None, *refs)
    bh, wg = lax.axis_index("bh"), lax.axis_index("wg")
    turn = None if turn_bars is None else _Turns(turn_bars, wg)
    block = _launch_order(lax.axis_index("q"), seq_len // (COMPUTE_WGS * bq), version)
    cta_first = block * (COMPUTE_WGS * bq)
    first, end = _key_range(cta_first, COMPUTE_WGS * bq, bk, window)

    def compute_context(run_pipeline):  # on each compute warpgroup: its 64 rows
      row0 = cta_first + wg * bq
      rows = pl.ds(row0, bq)
      plgpu.copy_gmem_to_smem(_head(q_ref, bh, heads).at[rows], q_s.at[wg], q_bar.at[wg])
      for i, ref in enumerate((hi_ref, lo_ref, seg_ref, thr_ref)):
        plgpu.copy_gmem_to_smem(ref.at[bh, rows], rows_s.at[wg, i], q_bar.at[wg])
      plgpu.barrier_wait(q_bar.at[wg])
      row_layout = plgpu.Layout.WGMMA.reduce(1)
      init = (plgpu.layout_cast(jnp.zeros((bq, head_dim), jnp.float32), plgpu.Layout.WGMMA),
              plgpu.layout_cast(jnp.full((bq,), -jnp.inf, jnp.float32), row_layout),
              plgpu.layout_cast(jnp.zeros((bq,), jnp.float32), row_layout))
      if turn is not None:  # warpgroup 0 takes the first turn
        pl.when(wg == 1)(turn.hand_over)
      acc, m, l = run_pipeline(init)
      if turn is not None:  # and warpgroup 0 takes back the token warpgroup 1 handed over last
        pl.when(wg == 0)(turn.wait)
      o = acc / _across(l, acc.shape, 0)  # every row sees itself: l >= 1
      lse = m + jnp.log2(l)

      # o, o_lo and lse go out through this warpgroup's tiles, addressed by a static index:
      # addresses computed from ``wg`` before the sweep and kept for these stores spilled (8 to
      # 64 B, every wide-key forward with a window, or at D = 64 with two parts)
      def write_out(w):
        q_s.at[w][...] = o.astype(q_s.dtype)  # Q's tile is free: its last product is done
        if two_part:  # o's rounding residual, in bf16 (see O_LO_DTYPE)
          o_lo_s.at[w][...] = (o - o.astype(q.dtype).astype(jnp.float32)).astype(O_LO_DTYPE)
        # the rows' own part of the decay, left out of m (folded_decay)
        lse_s.at[w][...] = lse + _rows(rows_s.at[w, 1], 0) if version.folded_decay else lse
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(q_s.at[w], _head(o_ref, bh, heads).at[rows])
        if two_part:
          plgpu.copy_smem_to_gmem(o_lo_s.at[w], _head(o_lo_ref, bh, heads).at[rows])
        plgpu.copy_smem_to_gmem(lse_s.at[w], lse_ref.at[bh, rows])
        plgpu.wait_smem_to_gmem(0)
      for w in range(COMPUTE_WGS):
        pl.when(wg == w)(functools.partial(write_out, w))

    def step(index, k_s, k_vectors, v_s, *barriers_and_carry):
      # with early_key_release each input's produced barriers, then its consumed ones
      *barriers, carry = barriers_and_carry
      k_stage, vectors_stage, v_stage = (
          [_Stage(pair) for pair in zip(barriers[:3], barriers[3:])] if barriers else [_Stage()] * 3)
      k_stage.ready()  # V may land later: P V waits for it
      vectors_stage.ready()
      row0, k0 = cta_first + wg * bq, (index[0] + first) * bk
      queries = _Positions(row0, rows_s.at[wg, 0], rows_s.at[wg, 1], rows_s.at[wg, 2], axis=0)
      keys = _Positions(k0, *(k_vectors.at[i] for i in range(3)), axis=1)

      def tile_update(carry):
        acc, m, l = carry
        scores = _matmul(q_s.at[wg], k_s.T, (bq, bk), turn)
        k_stage.release()  # S is in registers: K's stage may be refilled while P V runs
        if not version.folded_decay:
          s = _logits2(scores, queries, keys, scale2, window, version.unmasked_interior)
          m_new = jnp.maximum(m, s.max(axis=1))
        else:  # s less the rows' part of the decay, gap + e_i; m less e_i (_probabilities)
          s = _logits2(scores, queries, keys, scale2, window, version.unmasked_interior, -keys.second)
          gap = _gap2(queries, keys)
          m_new = jnp.maximum(m, s.max(axis=1) + gap)
        m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # rows with no key seen yet stay at zero
        p = jnp.exp2(s - _across(m_safe - gap if version.folded_decay else m_safe, s.shape, 0))
        alpha = jnp.exp2(m - m_safe)
        vectors_stage.release()  # the keys' vectors are read: P is computed
        values = [p]  # P: wgmma's A operand
        if two_part:  # and P's rounding residual, so that o + o_lo is P V to float32's precision
          values.append(p - p.astype(q.dtype).astype(jnp.float32))
        parts = [(a, v_s) for a in _a_operands(values, q.dtype, [ref.at[wg] for ref in p_tiles])]
        v_stage.ready()
        return _rescaled_products(acc, alpha, parts, version, turn), m_new, l * alpha + p.sum(axis=1)

      def skip(carry):  # a skipped tile takes its two turns all the same, and its stages
        k_stage.release()
        vectors_stage.release()
        v_stage.ready()
        for _ in range(2 if turn is not None else 0):
          _issued_in_turn(turn, lambda: None)
        return carry

      # blocks wholly right of this warpgroup's diagonal, or left of its window, are skipped,
      # and so are those pruning may skip
      seen = k0 < row0 + bq
      if window is not None:
        seen &= k0 + bk - 1 > row0 - window
      if prune:
        seen &= jnp.logical_not(_prunable(queries, keys, rows_s.at[wg, 3][0]))
        if bk > ANCHOR_BLOCK:  # the tile's pruned 64-key blocks, a prefix, masked
          keys.first_kept = _pruned_prefix(queries, keys, rows_s.at[wg, 3][0])
      carry = lax.cond(seen, tile_update, skip, carry)
      v_stage.release()  # P V is done
      return carry

    # the copying warpgroup keeps 32 registers, each compute warpgroup gets 240: with 40 (232) the
    # two-part forward with 128 keys a tile spilled 8 B at D = 64 (a window's bounds, reloaded
    # every step)
    matrix = _from_block(first, (bk, head_dim), tile)  # K's and V's
    plgpu.emit_pipeline_warp_specialized(
        step, grid=(end - first,), memory_registers=32, wg_axis="wg", num_compute_wgs=COMPUTE_WGS,
        max_concurrent_steps=STAGES, compute_context=compute_context,
        in_specs=[matrix, plgpu.BlockSpec((3, bk), lambda j: (0, j + first)), matrix],
        manual_produced_barriers=version.early_key_release, manual_consumed_barriers=version.early_key_release,
    )(_head(k_ref, bh, heads, group), key_vectors_ref.at[bh], _head(v_ref, bh, heads, group))

  o = jax.ShapeDtypeStruct(q.shape, q.dtype)
  o_lo = (jax.ShapeDtypeStruct(q.shape, O_LO_DTYPE),) if two_part else ()
  scratch = _forward_scratch(version, q.dtype, head_dim, bk, two_part, turns)
  return plgpu.kernel(
      _named(body, "fwd_two_part" if two_part else "fwd", version),
      out_type=(o, *o_lo, jax.ShapeDtypeStruct((bh_count, seq_len), jnp.float32)),
      scratch_types=scratch, grid=(bh_count, seq_len // (COMPUTE_WGS * bq)), grid_names=("bh", "q"),
      num_threads=COMPUTE_WGS + 1, thread_name="wg", interpret=interpret,
      compiler_params=_compiler_params(version),
  )(q, k, v, c_hi, c_lo, seg, thr, key_vectors)


# ----------------------------------------------------------------------------- backward


def _query_sweep_call(q, k, v, c_hi, c_lo, seg, thr, do, lse, delta, *, heads, group, scale2, sm_scale, window,
                      prune, interpret, row_term, version, bounds=None):
  """Per query block of 64 rows, over its key blocks: dq [B, T, HQ, D] (times ``sm_scale``), with
  ``version.two_part_output`` also the rows' sums of dS [BH, T] (dc's row half); or with
  ``row_term`` delta_i = sum_j P_ij dP_ij [BH, T] (``delta`` is then unused). With ``bounds``
  (``_prune_bounds``), the sweep starts at the block's first unpruned key block."""
  bh_count, seq_len, head_dim = _sizes(q)
  bq, bk = TILES.block_q_dq, TILES.block_k_dq
  tile, ds_tile = _smem_tiles(head_dim, q.dtype), _smem_tiles(bk, q.dtype)
  starts = () if bounds is None else (bounds[0],)
  inputs = (q, k, v, c_hi, c_lo, seg, thr, do, lse, delta, *starts)
  row_sums = version.two_part_output and not row_term

  def body(*refs):
    q_ref, k_ref, v_ref, hi_ref, lo_ref, seg_ref, thr_ref, do_ref, lse_ref, delta_ref = refs[:10]
    vector_refs = (hi_ref, lo_ref, seg_ref, lse_ref, delta_ref, thr_ref, *refs[10:len(inputs)])
    out_ref, *refs = refs[len(inputs):]
    sums_ref, q_s, do_s, rows_s, out_s, *refs = refs if row_sums else (None, *refs)
    sums_s, bar, *ds_tiles = refs if row_sums else (None, *refs)
    bh, block = lax.axis_index("bh"), _launch_order(lax.axis_index("q"), seq_len // bq, version)
    row0 = block * bq
    rows = pl.ds(row0, bq)
    plgpu.copy_gmem_to_smem(_head(q_ref, bh, heads).at[rows], q_s, bar)
    plgpu.copy_gmem_to_smem(_head(do_ref, bh, heads).at[rows], do_s, bar)
    for i, ref in enumerate(vector_refs):
      plgpu.copy_gmem_to_smem(ref.at[bh, rows], rows_s.at[i], bar)
    plgpu.barrier_wait(bar)
    queries = _Positions(row0, rows_s.at[0], rows_s.at[1], rows_s.at[2], axis=0)
    lse2, delta_rows = _rows(rows_s.at[3], 0), _rows(rows_s.at[4], 0)
    first, end = _key_range(row0, bq, bk, window)
    if starts:  # the pruned key blocks, a prefix: skipped by the bounds, not read
      first = jnp.maximum(first, rows_s.at[6][0].astype(jnp.int32))

    in_place = version.in_place_accumulators and not row_term

    def sweep(dq_acc):
      def step(index, k_s, v_s, k_hi, k_lo, k_seg, carry):
        keys = _Positions((index[0] + first) * bk, k_hi, k_lo, k_seg, axis=1)

        def tile_update(carry):
          p = _probabilities(_matmul(q_s, k_s.T, (bq, bk)), queries, keys, lse2, scale2, window, version,
                             version.unmasked_interior)
          dp = _matmul(do_s, v_s.T, (bq, bk))
          if row_term:
            return carry + (p * dp).sum(axis=1)
          dq, sums = carry
          ds = p * (dp - _across(delta_rows, p.shape, 0))
          if row_sums:
            sums = sums + ds.sum(axis=1)
          ds_operand, = _a_operands([ds], q.dtype, ds_tiles)
          return _accumulate(dq_acc, dq, ds_operand, k_s), sums

        if starts:
          return _in_flight_done(in_place, tile_update(carry))
        # the forward's tiles: the same skips
        return _in_flight_done(in_place, _unless_pruned(prune, queries, keys, rows_s.at[5][0], tile_update, carry))

      vector = jnp.zeros((bq,), jnp.float32)
      init = vector if row_term else (None if in_place else jnp.zeros((bq, head_dim), jnp.float32), vector)
      result = plgpu.emit_pipeline(
          step, grid=(end - first,), max_concurrent_steps=STAGES, init_carry=init,
          in_specs=_key_specs(first, bk, head_dim, tile),
      )(_head(k_ref, bh, heads, group), _head(v_ref, bh, heads, group), hi_ref.at[bh], lo_ref.at[bh], seg_ref.at[bh])
      return (dq_acc[...], result[1]) if in_place else result

    if row_term:
      out_s[...] = sweep(None)
    else:
      dq, sums = _with_accumulators(sweep, [(bq, head_dim)], in_place)
      out_s[...] = (dq * sm_scale).astype(out_s.dtype)
      if row_sums:
        sums_s[...] = sums
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(out_s, out_ref.at[bh, rows] if row_term else _head(out_ref, bh, heads).at[rows])
    if row_sums:
      plgpu.copy_smem_to_gmem(sums_s, sums_ref.at[bh, rows])
    plgpu.wait_smem_to_gmem(0)

  vector = jax.ShapeDtypeStruct((bh_count, seq_len), jnp.float32)
  out = vector if row_term else jax.ShapeDtypeStruct(q.shape, q.dtype)
  out_smem = plgpu.SMEM((bq,), jnp.float32) if row_term else plgpu.SMEM((bq, head_dim), q.dtype, transforms=tile)
  vectors = 6 + len(starts)
  return plgpu.kernel(
      _named(body, "row_term" if row_term else "dq", version), out_type=(out, vector) if row_sums else out,
      scratch_types=[plgpu.SMEM((bq, head_dim), q.dtype, transforms=tile),  # q
                     plgpu.SMEM((bq, head_dim), q.dtype, transforms=tile),  # dO
                     # the rows' c hi, second vector, ids, lse, delta, threshold (and first key block)
                     plgpu.SMEM((vectors, bq), jnp.float32),
                     out_smem] + [plgpu.SMEM((bq,), jnp.float32)] * row_sums  # (the rows' sums of dS)
                    + [plgpu.Barrier(num_arrivals=2 + vectors)]
                    + ([] if row_term else _operand_tiles(version, (bq, bk), q.dtype, ds_tile)),  # dS
      grid=(bh_count, seq_len // bq), grid_names=("bh", "q"), interpret=interpret,
      compiler_params=_compiler_params(version),
  )(*inputs)


def _key_sweep_call(q, k, v, c_hi, c_lo, seg, thr, do, lse, delta, *, heads, group, scale2, sm_scale, window,
                    prune, interpret, share_dtype, version, bounds=None):
  """Per key block of 64 keys and query head, over the query blocks that see it: that head's
  shares of dK (times ``sm_scale``) and dV [B, T, HQ, D] in ``share_dtype``, and dc [BH, T]. With
  ``bounds`` (``_prune_bounds``), the sweep ends before the block's first pruned query block."""
  bh_count, seq_len, head_dim = _sizes(q)
  bq, bk = TILES.block_q_dkv, TILES.block_k_dkv
  tile, t_tile = _smem_tiles(head_dim, q.dtype), _smem_tiles(bq, q.dtype)
  out_tile = _smem_tiles(head_dim, share_dtype)
  ends = () if bounds is None else (bounds[1],)
  inputs = (q, k, v, c_hi, c_lo, seg, thr, do, lse, delta, *ends)

  def body(*refs):
    q_ref, k_ref, v_ref, hi_ref, lo_ref, seg_ref, thr_ref, do_ref, lse_ref, delta_ref = refs[:10]
    vector_refs = (hi_ref, lo_ref, seg_ref, thr_ref, *refs[10:len(inputs)])
    dk_ref, dv_ref, dc_ref, k_s, v_s, cols_s, out_s, dc_s, bar, *a_tiles = refs[len(inputs):]
    p_tiles, ds_tiles = a_tiles[:1], a_tiles[1:]
    bh, block = lax.axis_index("bh"), lax.axis_index("k")
    k0 = block * bk
    cols = pl.ds(k0, bk)
    plgpu.copy_gmem_to_smem(_head(k_ref, bh, heads, group).at[cols], k_s, bar)
    plgpu.copy_gmem_to_smem(_head(v_ref, bh, heads, group).at[cols], v_s, bar)
    for i, ref in enumerate(vector_refs):
      plgpu.copy_gmem_to_smem(ref.at[bh, cols], cols_s.at[i], bar)
    plgpu.barrier_wait(bar)
    # S^T: the keys are the tile's rows (axis 0), the queries its columns
    keys = _Positions(k0, cols_s.at[0], cols_s.at[1], cols_s.at[2], axis=0)
    first, end = _query_range(k0, bk, bq, seq_len // bq, window)
    if ends:  # the pruned query blocks, a suffix: skipped by the bounds, not read
      end = jnp.minimum(end, cols_s.at[4][0].astype(jnp.int32))

    in_place = version.in_place_accumulators

    def sweep(dk_acc, dv_acc):
      def step(index, q_s, do_s, q_hi, q_lo, q_seg, q_lse, q_delta, carry):
        queries = _Positions((index[0] + first) * bq, q_hi, q_lo, q_seg, axis=1)

        def tile_update(carry):
          dk, dv, dc = carry
          p_t = _probabilities(_matmul(k_s, q_s.T, (bk, bq)), queries, keys, _rows(q_lse, 1), scale2, window, version,
                               _key_sweep_skips_masks(version, head_dim))
          p_operand, = _a_operands([p_t], q.dtype, p_tiles)
          dv = _accumulate(dv_acc, dv, p_operand, do_s)  # dV += P^T dO
          dp_t = _matmul(v_s, do_s.T, (bk, bq))  # dP^T = V dO^T (reading it waits for dV's product)
          ds_t = p_t * (dp_t - _across(_rows(q_delta, 1), p_t.shape, 1))
          ds_operand, = _a_operands([ds_t], q.dtype, ds_tiles)
          return _accumulate(dk_acc, dk, ds_operand, q_s), dv, dc - ds_t.sum(axis=1)  # dK += dS^T Q

        if ends:
          return _in_flight_done(in_place, tile_update(carry))
        return _in_flight_done(in_place, _unless_pruned(prune, queries, keys, cols_s.at[3][0], tile_update, carry))

      zeros = None if in_place else jnp.zeros((bk, head_dim), jnp.float32)
      specs = [_from_block(first, (bq, head_dim), tile)] * 2 + [_from_block(first, (bq,))] * 5
      dk, dv, dc = plgpu.emit_pipeline(
          step, grid=(end - first,), max_concurrent_steps=STAGES, in_specs=specs,
          init_carry=(zeros, zeros, jnp.zeros((bk,), jnp.float32)),
      )(_head(q_ref, bh, heads), _head(do_ref, bh, heads),
        *(ref.at[bh] for ref in (hi_ref, lo_ref, seg_ref, lse_ref, delta_ref)))
      return (dk_acc[...], dv_acc[...], dc) if in_place else (dk, dv, dc)

    dk, dv, dc = _with_accumulators(sweep, [(bk, head_dim)] * 2, in_place)
    out_s.at[0][...] = (dk * sm_scale).astype(out_s.dtype)
    out_s.at[1][...] = dv.astype(out_s.dtype)
    dc_s[...] = dc
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(out_s.at[0], _head(dk_ref, bh, heads).at[cols])
    plgpu.copy_smem_to_gmem(out_s.at[1], _head(dv_ref, bh, heads).at[cols])
    plgpu.copy_smem_to_gmem(dc_s, dc_ref.at[bh, cols])
    plgpu.wait_smem_to_gmem(0)

  share = jax.ShapeDtypeStruct(q.shape, share_dtype)
  return plgpu.kernel(
      _named(body, "dkv", version),
      out_type=(share, share, jax.ShapeDtypeStruct((bh_count, seq_len), jnp.float32)),
      scratch_types=[plgpu.SMEM((bk, head_dim), k.dtype, transforms=tile),  # k
                     plgpu.SMEM((bk, head_dim), v.dtype, transforms=tile),  # v
                     # the columns' c hi, second vector, ids, threshold (and end query block)
                     plgpu.SMEM((4 + len(ends), bk), jnp.float32),
                     plgpu.SMEM((2, bk, head_dim), share_dtype, transforms=out_tile),  # dK, dV
                     plgpu.SMEM((bk,), jnp.float32),  # dc
                     plgpu.Barrier(num_arrivals=6 + len(ends))]
                    + _operand_tiles(version, (bk, bq), q.dtype, t_tile, count=2),  # P^T, dS^T
      grid=(bh_count, seq_len // bk), grid_names=("bh", "k"), interpret=interpret,
      compiler_params=_compiler_params(version),
  )(*inputs)


def _store(value, stage, dst, add=False):
  """``value`` written to ``dst`` in HBM through the SMEM tile ``stage`` (rewritten once the last
  store from it has read it), in the stage's dtype; with ``add``, added into ``dst`` by a TMA
  reduce-add (``_fused_sweep_call``'s shares of dQ and of dS's rows' sums; JAX's interpreter has
  none, so there each key block stores its shares into a slice of its own instead)."""
  plgpu.wait_smem_to_gmem(0, wait_read_only=True)
  stage[...] = value.astype(stage.dtype)
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(stage, dst, reduction_op="add" if add else None)


def _fused_sweep_call(q, k, v, c_hi, c_lo, seg, thr, do, lse, delta, *, heads, group, scale2, sm_scale, window,
                      prune, interpret, share_dtype, version, bounds=None):
  """The whole backward in one kernel (``Version.fused_backward``): per key block of 64 keys and
  query head, over the query blocks that see it, two compute warpgroups split each tile's five
  matmuls by role while a third issues the Q, dO and vector copies:

  * warpgroup 0: S^T = K Q^T and P^T (handed to warpgroup 1 through float32 SMEM), dV += P^T dO
    in its accumulator, then, once warpgroup 1 has stored dS^T, the tile's share of dQ, dS K,
    added into a float32 dQ in HBM by a TMA reduce-add;
  * warpgroup 1: dP^T = V dO^T, dS^T = P^T (dP^T - delta) (stored for warpgroup 0), dK += dS^T Q
    in its accumulator, dc's column half, and the tile's share of dS's rows' sums (dc's row
    half), reduce-added in HBM as dQ is.

  The two meet on two barriers a tile: P^T ready (0 -> 1) and dS^T ready (1 -> 0); a warpgroup
  ends its step only when its products are done, so each one-slot tile is rewritten only after
  the other warpgroup has read it (warpgroup 0 writes P^T again after dS^T's barrier, on which
  warpgroup 1 arrives after reading P^T; warpgroup 1 writes dS^T again after the next P^T
  barrier, on which warpgroup 0 arrives after its dQ product). Only warpgroup 1 reduces across
  warps (dS's rows' sums), through a scratch slot of Mosaic's that both would share: a
  reduction on warpgroup 0 too would need its own synchronization (as ``_prunable`` notes for
  the forward).

  Returns that head's dK (times ``sm_scale``) and dV shares [B, T, HQ, D] in ``share_dtype``, dc's
  column half [BH, T], and the float32 sums over the key blocks of dQ (not yet times ``sm_scale``)
  [B, T, HQ, D] and of dc's row half [BH, T]. The reduce-adds leave dQ's rounding to the order
  the key blocks land in (impl="mosaic_gpu", with its dQ kernel, is deterministic). JAX's
  interpreter has no reduce-add: under it each key block stores its shares into a slice of its
  own, summed by XLA afterwards (T/64 copies of dQ: for tests)."""
  # pruning tests each tile, as the forward does: an end read from memory as the sweep's bound is
  # not uniform across a warp to ptxas, and 396 B (D = 64) to 780 B (D = 128) of spills followed
  del bounds
  bh_count, seq_len, head_dim = _sizes(q)
  bq, bk = TILES.block_q_dkv, TILES.block_k_dkv
  tile, t_tile = _smem_tiles(head_dim, q.dtype), _smem_tiles(bq, q.dtype)
  in_slices = interpret is not None
  slices = (seq_len // bk,) if in_slices else ()
  dq_sum = jax.new_ref(jnp.zeros(slices + q.shape, jnp.float32))
  sums_sum = jax.new_ref(jnp.zeros(slices + (bh_count, seq_len), jnp.float32))
  inputs = (q, k, v, c_hi, c_lo, seg, thr, do, lse, delta)
  # dV's share goes out through dQ's float32 stage where the shares are float32 (grouped K/V):
  # a tile of its own would not fit in SMEM beside the rest
  f32_shares = jnp.dtype(share_dtype) == jnp.float32

  def body(*refs):
    q_ref, k_ref, v_ref, hi_ref, lo_ref, seg_ref, thr_ref, do_ref, lse_ref, delta_ref = refs[:10]
    vector_refs = (hi_ref, lo_ref, seg_ref, thr_ref)
    (dq_ref, sums_ref, dk_ref, dv_ref, dc_ref, k_s, v_s, cols_s, p_s, ds_s, dq_s, sums_s, dc_s, out_s,
     kv_bar, p_ready, ds_ready, *p_tiles) = refs[len(inputs):]
    dk_stage, dv_stage = (out_s.at[0], dq_s if f32_shares else out_s.at[1])
    bh, block, wg = lax.axis_index("bh"), lax.axis_index("k"), lax.axis_index("wg")
    k0 = block * bk
    cols = pl.ds(k0, bk)

    # K, V and the keys' vectors, waited for by all three warpgroups before the pipeline, and the
    # sweep's range computed after the wait: ptxas is sensitive to both (waited for only inside the
    # compute warpgroups' context, 16-32 B of spills at D = 128; the range computed before the
    # wait, with a window, 1036 B; measured, and test_compile_for_chips.py compiles the window)
    @pl.when(wg == 0)
    def _():
      plgpu.copy_gmem_to_smem(_head(k_ref, bh, heads, group).at[cols], k_s, kv_bar)
      plgpu.copy_gmem_to_smem(_head(v_ref, bh, heads, group).at[cols], v_s, kv_bar)
      for i, ref in enumerate(vector_refs):
        plgpu.copy_gmem_to_smem(ref.at[bh, cols], cols_s.at[i], kv_bar)
    plgpu.barrier_wait(kv_bar)
    first, end = _query_range(k0, bk, bq, seq_len // bq, window)
    # the keys' anchor read once: read in the sweep, 48 B of spills at D = 128 (folded_decay)
    k_anchor = cols_s.at[0][ANCHOR]
    if in_slices:
      dq_ref, sums_ref = dq_ref.at[block], sums_ref.at[block]
    accumulator = []  # the warpgroup's (dV's on 0, dK's on 1), live across the sweep: set below

    def compute_context(run_pipeline):  # on the two compute warpgroups (the third copies Q, dO, ...)
      def sweep(acc):
        accumulator.append(acc)
        dc = run_pipeline(plgpu.layout_cast(jnp.zeros((bk,), jnp.float32), plgpu.Layout.WGMMA.reduce(1)))
        return acc[...], dc

      grad, dc = pl.run_scoped(sweep, plgpu.ACC((bk, head_dim), jnp.float32))

      @pl.when(wg == 0)
      def _():
        _store(grad, dv_stage, _head(dv_ref, bh, heads).at[cols])

      @pl.when(wg == 1)
      def _():
        _store(grad * sm_scale, dk_stage, _head(dk_ref, bh, heads).at[cols])
        _store(dc, dc_s, dc_ref.at[bh, cols])
      plgpu.wait_smem_to_gmem(0)

    def step(index, q_s, do_s, q_hi, q_lo, q_seg, q_lse, q_delta, dc):
      q0 = (index[0] + first) * bq
      # the tile's two sides, loaded where they are used (S^T: the keys are its rows)
      sides = lambda: (_Positions(q0, q_hi, q_lo, q_seg, axis=1),
                       _Positions(k0, *(cols_s.at[i] for i in range(3)), axis=0, anchor=k_anchor))
      acc, = accumulator

      def probabilities_dv_dq(dc):  # warpgroup 0
        p_t = _probabilities(_matmul(k_s, q_s.T, (bk, bq)), *sides(), _rows(q_lse, 1), scale2, window, version,
                             _key_sweep_skips_masks(version, head_dim))
        p_s[...] = p_t
        p_operand, = _a_operands([p_t], q.dtype, p_tiles)
        plgpu.commit_smem()  # p_s's store (on the tested path _a_operands has committed it already)
        plgpu.barrier_arrive(p_ready)
        plgpu.wgmma(acc, p_operand, do_s)  # dV += P^T dO
        plgpu.barrier_wait(ds_ready)
        dq = _matmul(ds_s.T, k_s, (bq, head_dim))  # dS K (reading it waits for dV's product too)
        _store(dq, dq_s, _head(dq_ref, bh, heads).at[pl.ds(q0, bq)], add=not in_slices)
        return dc

      def scores_grad_dk(dc):  # warpgroup 1
        dp_t = _matmul(v_s, do_s.T, (bk, bq))  # dP^T = V dO^T
        plgpu.barrier_wait(p_ready)
        ds_t = plgpu.load(p_s, layout=plgpu.Layout.WGMMA) * (dp_t - _across(_rows(q_delta, 1), dp_t.shape, 1))
        ds_s[...] = ds_t.astype(ds_s.dtype)
        plgpu.commit_smem()
        plgpu.barrier_arrive(ds_ready)
        plgpu.wgmma(acc, ds_s, q_s)  # dK += dS^T Q, from the tile warpgroup 0 reads too
        _store(ds_t.sum(axis=0), sums_s, sums_ref.at[bh, pl.ds(q0, bq)], add=not in_slices)
        return dc - ds_t.sum(axis=1)

      def tile_update(dc):
        return lax.cond(wg == 0, probabilities_dv_dq, scores_grad_dk, dc)
      # both warpgroups skip the same tiles (the forward's), barriers and all
      return _in_flight_done(True, _unless_pruned(prune, *sides(), cols_s.at[3][0], tile_update, dc))

    # the copying warpgroup keeps 32 registers, the two compute warpgroups get 240 each: with 40
    # (232) the folded decay left 12 B of spills at D = 128
    plgpu.emit_pipeline_warp_specialized(
        step, grid=(end - first,), memory_registers=32, wg_axis="wg", num_compute_wgs=2,
        max_concurrent_steps=STAGES, compute_context=compute_context,
        in_specs=[_from_block(first, (bq, head_dim), tile)] * 2 + [_from_block(first, (bq,))] * 5,
    )(_head(q_ref, bh, heads), _head(do_ref, bh, heads),
      *(ref.at[bh] for ref in (hi_ref, lo_ref, seg_ref, lse_ref, delta_ref)))

  share = jax.ShapeDtypeStruct(q.shape, share_dtype)
  vector = jax.ShapeDtypeStruct((bh_count, seq_len), jnp.float32)
  scratch = [plgpu.SMEM((bk, head_dim), k.dtype, transforms=tile),  # k
             plgpu.SMEM((bk, head_dim), v.dtype, transforms=tile),  # v
             plgpu.SMEM((4, bk), jnp.float32),  # the columns' c hi, second vector, ids, threshold
             plgpu.SMEM((bk, bq), jnp.float32),  # P^T, for warpgroup 1
             plgpu.SMEM((bk, bq), q.dtype, transforms=t_tile),  # dS^T
             plgpu.SMEM((bq, head_dim), jnp.float32, transforms=_smem_tiles(head_dim, jnp.float32)),  # dQ's share
             plgpu.SMEM((bq,), jnp.float32),  # the rows' sums' share
             plgpu.SMEM((bk,), jnp.float32),  # dc
             plgpu.SMEM((1 if f32_shares else 2, bk, head_dim), share_dtype,
                        transforms=_smem_tiles(head_dim, share_dtype)),  # dK (and dV)
             plgpu.Barrier(num_arrivals=6),
             plgpu.Barrier(), plgpu.Barrier()]  # K, V, the vectors; P^T ready; dS^T ready
  scratch += _operand_tiles(version, (bk, bq), q.dtype, t_tile)  # P^T, warpgroup 0's A operand
  dk, dv, dc = plgpu.kernel(
      _named(body, "dkv_dq", version), out_type=(share, share, vector), scratch_types=scratch,
      grid=(bh_count, seq_len // bk), grid_names=("bh", "k"), num_threads=3, thread_name="wg",
      interpret=interpret, compiler_params=_compiler_params(version),
  )(*inputs, dq_sum, sums_sum)
  dq, sums = dq_sum[...], sums_sum[...]
  if in_slices:
    dq, sums = dq.sum(axis=0), sums.sum(axis=0)
  return dk, dv, dc, dq, sums


# ----------------------------------------------------------------------------- the GpuKernels


def _flat(x):
  """[B, H, T] -> [B * H, T]."""
  return x.reshape(-1, x.shape[-1])


def _prune_bounds(hi, thr, block):
  """Per position (the [BH, T] float32 vectors every block reads, as it reads its c): for a query
  block, its first key block that pruning keeps; for a key block, the end of the query blocks
  that pruning keeps. Tile (query block r, key block j) is pruned when c at r's first row minus c
  at j's last column is below the threshold: ``_prunable``'s test, in the same float32 operations
  on the same high parts of c, so the sweeps skip exactly the tiles the forward skips (with 128
  keys a tile it skips or masks them per 64 keys: ``_pruned_prefix``). c does not
  increase along the sequence (nor does its rounded difference), so the pruned tiles of a row of
  tiles are a prefix of its key blocks, and those of a column a suffix of its query blocks."""
  firsts, lasts = hi[:, ::block], hi[:, block - 1::block]  # [BH, N]: c at each block's first row, last column
  pruned = firsts[:, :, None] - lasts[:, None, :] < thr[:, None, None]  # [BH, N query blocks, N key blocks]
  per_position = lambda x: jnp.repeat(x.astype(jnp.float32), block, axis=1)
  return per_position(pruned.sum(axis=2)), per_position(pruned.shape[1] - pruned.sum(axis=1))


def _in_block_decay2(c, block=ANCHOR_BLOCK):
  """``Version.folded_decay``'s second vector: e_t = (c_t - hi at its block's anchor) log2 e, per
  position of c (decay.py's two parts [B, H, T], T a multiple of ``block``), the anchor being the
  middle of each ``block`` positions, formed from the parts (hi's difference exact within a factor
  2, as in decay.difference)."""
  anchors = jnp.repeat(c.hi[..., block // 2::block], block, axis=-1)
  return ((c.hi - anchors) + c.lo) * LOG2_E


def _prepared(q, k, v, ops, static, version):
  if static.pair:
    raise ValueError("forgetting_attention: impl='mosaic_gpu' has no context-parallel path yet")
  shapes = Shapes.of(q, k, static)
  # ids exact below 2^24; the pruning threshold repeated along the sequence, so that every
  # block reads it as it reads its c
  hi = _flat(ops.c_q.hi)
  thr = jnp.broadcast_to(ops.thr.reshape(-1, 1), hi.shape).astype(jnp.float32)
  # ids made monotone along the sequence (the padding's 0 after the last segment becomes that
  # segment's id), so that equal ids at a tile's corners mean one segment (``_interior``): no
  # pair of real positions changes, padded keys stay behind the causal mask, padded rows are cut
  seg = lax.cummax(ops.seg_q, axis=ops.seg_q.ndim - 1)
  second = _in_block_decay2(ops.c_q) if version.folded_decay else ops.c_q.lo
  vectors = (hi, _flat(second), _flat(seg).astype(jnp.float32), thr)
  bounds = None
  if static.prune and version.pruned_bounds:
    assert TILES.block_q_dq == TILES.block_k_dq == TILES.block_q_dkv == TILES.block_k_dkv  # one tile grid
    bounds = _prune_bounds(hi, ops.thr.reshape(-1).astype(jnp.float32), TILES.block_q_dq)
  options = dict(heads=shapes.heads, group=shapes.group, scale2=static.sm_scale * LOG2_E, window=static.window,
                 prune=static.prune, interpret=_interpret(static), version=version, bounds=bounds)
  return shapes, (q, k, v) + vectors, options


def _forward(version, q, k, v, ops, static, two_part=False):
  """(o, lse2), or with ``two_part`` (o, o_lo, lse2): ``_forward_call``'s outputs in the caller's layouts."""
  shapes, operands, options = _prepared(q, k, v, ops, static, version)
  key_tile = forward_key_tile(version, q.shape[-1])
  key_second = operands[4]  # the rows' own (lo, or e in blocks of ANCHOR_BLOCK)
  if version.folded_decay and key_tile != ANCHOR_BLOCK:  # e in blocks of the key tile
    key_second = _flat(_in_block_decay2(ops.c_q, key_tile))
  key_vectors = jnp.stack([operands[3], key_second, operands[5]], axis=1)  # hi, second, ids: [BH, 3, T]
  *outputs, lse2 = _forward_call(*operands, key_vectors, two_part=two_part, **options)
  return (*outputs, lse2.reshape(shapes.batch, shapes.heads, -1))


def _row_term(version, q, k, v, ops, do, lse2, static):
  shapes, operands, options = _prepared(q, k, v, ops, static, version)
  delta = _query_sweep_call(*operands, do, _flat(lse2), _flat(lse2), sm_scale=static.sm_scale,
                            row_term=True, **options)
  return delta.reshape(shapes.batch, shapes.heads, -1)


def _backward_dq(version, q, k, v, ops, do, lse2, delta, static):
  """dq; with ``version.two_part_output`` (dq, the rows' sums of dS [B, H, T])."""
  shapes, operands, options = _prepared(q, k, v, ops, static, version)
  dq = _query_sweep_call(*operands, do, _flat(lse2), _flat(delta), sm_scale=grad_scale(static),
                         row_term=False, **options)
  if not version.two_part_output:
    return dq
  dq, sums = dq
  return dq, sums.reshape(shapes.batch, shapes.heads, -1)


def _backward_dkv(version, q, k, v, ops, do, lse2, delta, static):
  shapes, operands, options = _prepared(q, k, v, ops, static, version)
  share_dtype = shapes.key_shares(k).dtype
  dk, dv, dc = _key_sweep_call(*operands, do, _flat(lse2), _flat(delta),
                               sm_scale=grad_scale(static), share_dtype=share_dtype, **options)
  return shapes.summed(dk, k), shapes.summed(dv, v), dc.reshape(shapes.batch, shapes.heads, -1)


def _backward(version, q, k, v, ops, do, lse2, delta, static):
  """(dq, dk, dv, dc) from ``_fused_sweep_call``'s one kernel, dc with both halves."""
  shapes, operands, options = _prepared(q, k, v, ops, static, version)
  share_dtype = shapes.key_shares(k).dtype
  dk, dv, dc, dq, sums = _fused_sweep_call(*operands, do, _flat(lse2), _flat(delta), sm_scale=grad_scale(static),
                                           share_dtype=share_dtype, **options)
  return ((dq * grad_scale(static)).astype(q.dtype), shapes.summed(dk, k), shapes.summed(dv, v),
          (dc + sums).reshape(shapes.batch, shapes.heads, -1))


def kernels_of(version):
  """The ``GpuKernels`` of one version."""
  if version.fused_backward and not version.two_part_output:
    raise ValueError(f"{version.name}: fused_backward adds dS's rows' sums into dc, which is right only with the "
                     f"two-part output's delta (two_part_output)")
  kernels = GpuKernels(*(functools.partial(kernel, version) for kernel in (_forward, _row_term, _backward_dq,
                                                                             _backward_dkv)))
  if not version.two_part_output:
    return kernels
  kernels = kernels._replace(forward_two_part=functools.partial(_forward, version, two_part=True))
  return kernels._replace(backward=functools.partial(_backward, version)) if version.fused_backward else kernels



def _register(version, priority):
  attention = single_device(kernels_of(version), version.name, HEAD_DIMS,
                            functools.partial(fit_block_sizes, version=version),
                            functools.partial(check_runnable, version=version))
  register_backend(Backend(version.name, attention, platforms=("gpu",), interpretable=not version.hardware_only,
                           head_dims=HEAD_DIMS,
                           dtypes=DTYPES, priority=priority, available=available,
                           suite_skips={"small_tiles": "tests/kernels/test_mosaic_gpu.py runs it at its own tiles, "
                                                       "on Python 3.12 / jax 0.11.2"}))
  return attention


# "auto" tries version 2 after pallas (20) until a GPU run shows it faster; version 1 only by name,
# kept to compare the two (compile counts now, times when a GPU is lent).
mosaic_gpu_attention = _register(V2, priority=10)
_register(V1, priority=None)
_register(V2_FUSED, priority=None)  # by name: its dQ is summed by reduce-adds (not deterministic)
_register(V2_HARDWARE, priority=None)  # by name; giving it a priority waits for gpu_check.sh to pass it on a GPU

"""Forgetting attention's PyTorch peers, timed on the same inputs and rows as attention.py.

Candidates (each skipped, with the reason, where it cannot be imported):
  ``fla``               fla's ``parallel_forgetting_attn`` (flash-linear-attention, Triton);
  ``fox_official``      the FoX authors' Triton kernel, ``forgetting_attention`` of
                        zhixuan-lin/forgetting-transformer (src/forgetting_transformer/ops/
                        forgetting_attention.py), loaded from the file given with --official;
  ``fox_official_acp``  the same with its adaptive computation pruning (``adaptive_threshold="auto"``);
  ``sdpa_flash``        PyTorch's scaled_dot_product_attention, flash backend, causal, no gate;
  ``sdpa_cudnn``        the same, cuDNN backend (the two floors of softmax attention in PyTorch).

Each row: forward and forward + backward time (median of --iters, CUDA events on a GPU), causal
TFLOP/s (attention_inputs.causal_flops, as attention.py) and the peak of PyTorch's allocator
during one forward + backward (inputs, outputs, gradients and temporaries; attention.py's memory
is XLA's arguments + outputs + temporaries of the same computation). Before its first row, each
candidate is checked once against the float64 ground truth (tests/float64_attention.py, numpy:
output and the gradients of q, k, v and log f; the floors with log f = 0) at --check-len tokens,
so that a ratio is never taken against a kernel that computes something else.

  python benchmarks/attention_peers.py --official .peers/fox_official/forgetting_attention.py
  python benchmarks/attention_peers.py --seq-lens 16384 --head-dims 128 --gate-timescales 32 2048 \\
      --impls fox_official fox_official_acp                            # what ACP buys

``--interpret`` rehearses every path on a CPU: the Triton kernels run in Triton's interpreter
(TRITON_INTERPRET=1, set before triton is imported) on CPU tensors, with three stand-ins for what
the interpreter lacks (the official kernel asks torch.cuda for the device's capability and
device context; Triton's autotuner benchmarks its configs through a GPU driver, so only each
kernel's first config is kept). Use float16 there: bfloat16 comes out wrong in the interpreter
(the official kernel's output was off by 8e8 at T = 256, float16 by 6e-4). Its times mean
nothing.
"""

import argparse
import contextlib
import importlib.util
import itertools
import os
import platform
import statistics
import sys
import time

import numpy as np
from attention_inputs import TABLE_HEADER, attention_inputs, row_line, row_shape, timing_figures

from lpcjax.files import write_json_atomic

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from float64_attention import forgetting_attention_float64, relative_errors  # noqa: E402

CANDIDATES = ("fla", "fox_official", "fox_official_acp", "sdpa_flash", "sdpa_cudnn")
GATED = ("fla", "fox_official", "fox_official_acp")
CHECK_NAMES = ("o", "dq", "dk", "dv", "dlog_f")
DEFAULT_OFFICIAL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".peers", "fox_official",
                                "forgetting_attention.py")


def parse_args():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seq-lens", type=int, nargs="+", default=[2048, 8192, 16384, 32768])
  parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
  parser.add_argument("--batch-tokens", type=int, default=32768, help="batch = max(1, batch_tokens // T)")
  parser.add_argument("--model-dim", type=int, default=2048, help="heads = model_dim // head_dim")
  parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
  parser.add_argument("--gate-timescales", type=float, nargs="+", default=[None],
                      help="gates of these decay times, in turn (attention_inputs.py)")
  parser.add_argument("--impls", nargs="+", default=list(CANDIDATES), choices=CANDIDATES)
  parser.add_argument("--official", default=DEFAULT_OFFICIAL, help="the official forgetting_attention.py")
  parser.add_argument("--iters", type=int, default=10)
  parser.add_argument("--check-len", type=int, default=1024, help="T of the float64 check (0: none)")
  parser.add_argument("--interpret", action="store_true", help="CPU rehearsal in Triton's interpreter")
  parser.add_argument("--out", default=None)
  return parser.parse_args()


def interpreter_stand_ins(torch):
  """What the Triton interpreter on a CPU lacks, for the official kernel and the autotuner."""
  from triton.runtime import autotuner
  torch.cuda.get_device_capability = lambda *device: (9, 0)  # picks the official kernel's H100 tiles
  torch.cuda.device_of = lambda tensor: contextlib.nullcontext()
  torch.cuda.device = lambda device: contextlib.nullcontext()
  prune = autotuner.Autotuner.prune_configs
  autotuner.Autotuner.prune_configs = lambda self, kwargs: prune(self, kwargs)[:1]


def load_candidates(torch, names, official_path):
  """name -> fn(q, k, v, log_f) on [B, T, H, D] tensors and [B, T, H] float32 log f, or the
  reason it cannot run."""
  functional = torch.nn.functional
  found = {}
  for name in names:
    try:
      if name == "fla":
        from fla.ops.forgetting_attn import parallel_forgetting_attn
        found[name] = lambda q, k, v, log_f: parallel_forgetting_attn(q, k, v, log_f)
      elif name.startswith("fox_official"):
        if not os.path.exists(official_path):
          raise FileNotFoundError(f"no official kernel at {official_path} (benchmarks/gpu_wheels.sh puts it there)")
        spec = importlib.util.spec_from_file_location("fox_official_attention", official_path)
        official = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(official)
        threshold = "auto" if name == "fox_official_acp" else None
        found[name] = (lambda attend, threshold: lambda q, k, v, log_f: attend(
            q, k, v, log_f, adaptive_threshold=threshold))(official.forgetting_attention, threshold)
      else:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}[name]

        def sdpa(q, k, v, log_f, backend=backend):
          del log_f
          heads_major = lambda x: x.transpose(1, 2)
          with sdpa_kernel(backend):
            o = functional.scaled_dot_product_attention(heads_major(q), heads_major(k), heads_major(v),
                                                        is_causal=True)
          return heads_major(o)
        found[name] = sdpa
    except Exception as error:  # a peer that cannot be imported is reported, not fatal
      found[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
  return found


class Runner:
  """Tensors, timing and memory on one torch device."""

  def __init__(self, torch, device, dtype):
    self.torch, self.device, self.dtype = torch, device, getattr(torch, dtype)
    self.cuda = device == "cuda"

  def tensors(self, inputs, gated=True):
    torch = self.torch
    as_input = lambda x, dtype: torch.tensor(x, dtype=dtype, device=self.device).requires_grad_()
    q, k, v = (as_input(inputs[name], self.dtype) for name in ("q", "k", "v"))
    log_f = inputs["log_f"] if gated else np.zeros_like(inputs["log_f"])
    return (q, k, v, as_input(log_f, torch.float32)), torch.tensor(inputs["do"], dtype=self.dtype,
                                                                   device=self.device)

  def forward_backward(self, attend, args, do):
    o = attend(*args)
    grads = self.torch.autograd.grad(o, args, do, allow_unused=True)
    return o, grads

  def seconds(self, fn, iters):
    """Median of iters runs after one warm-up."""
    torch = self.torch
    fn()
    times = []
    for _ in range(iters):
      if self.cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
      else:
        begin = time.perf_counter()
        fn()
        times.append(time.perf_counter() - begin)
    return statistics.median(times)

  def peak_bytes(self, fn):
    if not self.cuda:
      return None
    self.torch.cuda.synchronize()
    self.torch.cuda.reset_peak_memory_stats()
    fn()
    self.torch.cuda.synchronize()
    return int(self.torch.cuda.max_memory_allocated())


def check(runner, name, attend, seq_len, head_dim):
  """Relative errors (o, dq, dk, dv, d log f) against float64 at one head, batch 1."""
  inputs = attention_inputs(1, seq_len, 1, head_dim)
  gated = name in GATED
  args, do = runner.tensors(inputs, gated)
  o, grads = runner.forward_backward(attend, args, do)
  got = [o] + [g if g is not None else runner.torch.zeros_like(a) for g, a in zip(grads, args)]
  got = [x.detach().float().cpu().numpy() for x in got]
  log_f = inputs["log_f"] if gated else np.zeros_like(inputs["log_f"])
  # the float64 truth of the rounded inputs the kernel was given
  rounded = [a.detach().float().cpu().numpy() for a in args[:3]]
  truth = forgetting_attention_float64(*rounded, log_f, do.float().cpu().numpy())
  names = CHECK_NAMES if gated else CHECK_NAMES[:4]
  return dict(zip(names, relative_errors(got[:len(names)], truth[:len(names)])))


def measure(runner, attend, batch, heads, seq_len, head_dim, gated, gate_timescale, iters):
  inputs = attention_inputs(batch, seq_len, heads, head_dim, gate_timescale)
  args, do = runner.tensors(inputs, gated)
  with runner.torch.no_grad():
    fwd_s = runner.seconds(lambda: attend(*args), iters)
  fwd_bwd_s = runner.seconds(lambda: runner.forward_backward(attend, args, do), iters)
  memory = runner.peak_bytes(lambda: runner.forward_backward(attend, args, do))
  return {**timing_figures(batch, heads, seq_len, head_dim, fwd_s, fwd_bwd_s), "memory_bytes": memory}


def versions(torch, official_path):
  found = {"torch": torch.__version__, "python": platform.python_version()}
  for package in ("triton", "fla"):
    try:
      found[package] = importlib.import_module(package).__version__
    except Exception:
      found[package] = None
  commit_file = os.path.join(os.path.dirname(official_path), "COMMIT")
  found["fox_official_commit"] = open(commit_file).read().strip() if os.path.exists(commit_file) else None
  return found


def main():
  args = parse_args()
  if args.interpret:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported (fla imports it)
  import torch
  if args.interpret:
    interpreter_stand_ins(torch)
  device = "cuda" if torch.cuda.is_available() and not args.interpret else "cpu"
  runner = Runner(torch, device, args.dtype)
  candidates = load_candidates(torch, args.impls, args.official)
  out = args.out or os.path.join(os.path.dirname(__file__), "results", f"attention_peers_{device}.json")
  device_name = torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu"
  result = {"device": device_name, "torch_device": device, "interpreted": args.interpret, "dtype": args.dtype,
            "versions": versions(torch, args.official), "check_len": args.check_len, "checks": {}, "rows": [],
            "memory": "torch.cuda.max_memory_allocated over one forward + backward (inputs included)",
            "flops": "causal: forward 0.5*4*B*H*T^2*D, forward+backward 3.5x forward"}
  print(f"device: {device_name} ({device})  torch {torch.__version__}  dtype {args.dtype}  "
        f"gate timescales {args.gate_timescales}")
  for name, attend in candidates.items():
    if isinstance(attend, str):
      result["checks"][name] = {"error": attend}
    elif args.check_len:
      try:
        result["checks"][name] = check(runner, name, attend, args.check_len, args.head_dims[-1])
      except Exception as error:
        result["checks"][name] = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
    if name in result["checks"]:
      print(f"check {name:>17} at T={args.check_len}: " + ", ".join(
          f"{key} {value:.1e}" if isinstance(value, float) else f"{key} {value}"
          for key, value in result["checks"][name].items()), flush=True)
  print(TABLE_HEADER)
  for gate_timescale, head_dim, seq_len in itertools.product(args.gate_timescales, args.head_dims, args.seq_lens):
    batch, heads = row_shape(seq_len, head_dim, args.batch_tokens, args.model_dim)
    for name, attend in candidates.items():
      row = {"candidate": name, "batch": batch, "heads": heads, "seq_len": seq_len, "head_dim": head_dim,
             "gate_timescale": gate_timescale}
      if isinstance(attend, str):
        row["skipped"] = attend
      else:
        try:
          row.update(measure(runner, attend, batch, heads, seq_len, head_dim, name in GATED, gate_timescale,
                             args.iters))
        except Exception as error:  # a shape a peer cannot run is reported, not fatal
          row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        finally:
          if device == "cuda":
            torch.cuda.empty_cache()
      result["rows"].append(row)
      print(row_line(row), flush=True)
      write_json_atomic(out, result)  # after every row: a run cut short keeps what it measured
  write_json_atomic(out, result)
  print(f"wrote {out}")


if __name__ == "__main__":
  main()

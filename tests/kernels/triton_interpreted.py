"""Run impl="triton" on CPU: its Triton kernels under the Triton interpreter, on CPU torch tensors.

``interpreted_launcher()`` returns a stand-in for jax-triton's launch (kernels/triton_backend.py's
``launcher`` hook): a ``jax.pure_callback`` that sends the operands to a worker process, which
runs the kernel of that name from kernels/triton_kernels.py on CPU torch tensors and sends the
outputs back. Everything else of the backend (padding, the custom_vjp, the row term, the
reverse cumsum) runs as it does on a GPU.

Why a process: the interpreter needs TRITON_INTERPRET=1 from the moment ``triton.language`` is
first imported (its own library functions, tl.max or tl.sum, are decorated then), and in the
test process triton may already be imported, compiled, for other tests (tests/convert's fla
peer). The worker imports triton with the variable set and touches nothing else.

  python tests/kernels/triton_interpreted.py --worker   # what the launcher starts (stdin/stdout)
"""

import atexit
import os
import pickle
import struct
import subprocess
import sys

import numpy as np

KERNELS = os.path.join(os.path.dirname(__file__), "..", "..", "kernels", "triton_kernels.py")


def _send(stream, obj):
  data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
  stream.write(struct.pack("<Q", len(data)) + data)
  stream.flush()


def _receive(stream):
  header = stream.read(8)
  if len(header) < 8:
    raise EOFError("the interpreter worker closed its output")
  return pickle.loads(stream.read(struct.unpack("<Q", header)[0]))


def _pack(array):
  """numpy has no bfloat16 of its own (JAX's is ml_dtypes'): send such arrays as their bits."""
  array = np.ascontiguousarray(array)
  if array.dtype.name == "bfloat16":
    return "bfloat16", array.view(np.uint16)
  return array.dtype.name, array


# ------------------------------------------------------------------------------ worker process

def _bf16_dot_in_float32():
  """Triton 3.9's interpreter multiplies bfloat16 tiles as their raw uint16 bits (it stores
  bf16 as uint16 and hands those to np.matmul). Widen them to float32 first: bf16 x bf16
  products are exact there, accumulated in float32 as the tensor cores do."""
  import triton.language as tl
  from triton.runtime import interpreter
  create_dot = interpreter.InterpreterBuilder.create_dot
  widen = lambda h: (interpreter.TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32),
                                              tl.float32) if h.dtype == tl.bfloat16 else h)

  def dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    return create_dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)
  interpreter.InterpreterBuilder.create_dot = dot


def _worker():
  import importlib.util
  import torch
  _bf16_dot_in_float32()
  spec = importlib.util.spec_from_file_location("triton_kernels", KERNELS)
  kernels = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(kernels)
  to_torch = lambda name, a: (torch.from_numpy(a).view(torch.bfloat16) if name == "bfloat16"
                              else torch.from_numpy(a))
  stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
  sys.stdout = sys.stderr  # stray prints must not corrupt the replies
  while True:
    try:
      kernel_name, grid, inputs, outputs, constexprs = _receive(stdin)
    except EOFError:
      return
    try:
      outs = [torch.empty(shape, dtype=getattr(torch, name)) for shape, name in outputs]
      getattr(kernels, kernel_name)[grid](*(to_torch(*x) for x in inputs), *outs, **constexprs)
      _send(stdout, ("ok", [o.view(torch.uint16).numpy() if o.dtype == torch.bfloat16
                            else o.numpy() for o in outs]))
    except Exception as error:  # reported in the test process, with the kernel's name
      _send(stdout, ("error", f"{kernel_name}: {type(error).__name__}: {error}"))


# ------------------------------------------------------------------------------- test process

_PROCESS = None


def _process():
  global _PROCESS
  if _PROCESS is None or _PROCESS.poll() is not None:
    env = dict(os.environ, TRITON_INTERPRET="1", JAX_PLATFORMS="cpu")
    _PROCESS = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    atexit.register(_stop, _PROCESS)
  return _PROCESS


def _stop(process):
  if process.poll() is None:
    process.stdin.close()
    try:
      process.wait(timeout=10)
    except subprocess.TimeoutExpired:
      process.kill()


def run_kernel(kernel_name, grid, arrays, out_types, constexprs):
  """Run one kernel in the worker; arrays: numpy inputs; returns numpy outputs."""
  process = _process()
  outputs = [(tuple(t.shape), np.dtype(t.dtype).name) for t in out_types]
  _send(process.stdin, (kernel_name, tuple(grid), [_pack(a) for a in arrays], outputs,
                        constexprs))
  status, result = _receive(process.stdout)
  if status != "ok":
    raise RuntimeError(result)
  return tuple(r.view(t.dtype) for r, t in zip(result, out_types))


def interpreted_launcher():
  """A ``triton_backend.launcher``: same arguments as ``triton_backend.jax_triton_call``."""
  import jax

  def launch(kernel_name, grid, inputs, out_types, num_warps, num_stages, constexprs):
    del num_warps, num_stages  # the interpreter runs one program at a time
    single = not isinstance(out_types, (tuple, list))
    out_types = (out_types,) if single else tuple(out_types)
    run = lambda *arrays: run_kernel(kernel_name, grid, arrays, out_types, constexprs)
    results = jax.pure_callback(run, out_types, *inputs)
    return results[0] if single else results
  return launch


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
  _worker()

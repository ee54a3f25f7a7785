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

  python tests/triton_interpreted.py --worker KERNELS_PY   # what the launcher starts
"""

import atexit
import os
import pickle
import struct
import subprocess
import sys
import threading

import numpy as np



def _kernels_path():
  """kernels/triton_kernels.py as installed (lpcjax.kernels maps to the folder kernels/)."""
  import importlib.util
  folder = importlib.util.find_spec("lpcjax.kernels").submodule_search_locations[0]
  return os.path.join(folder, "triton_kernels.py")


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

def _bf16_as_on_a_gpu():
  """Two bfloat16 shortcuts of Triton 3.9's interpreter, undone: it multiplies bf16 tiles as
  their raw uint16 bits (it stores bf16 as uint16 and hands those to np.matmul), and it rounds
  float32 -> bf16 toward zero, where the GPU rounds to nearest even (Triton's default). The
  dot widens bf16 to float32 instead (bf16 x bf16 products are exact there, accumulated in
  float32 as on the tensor cores), and the cast rounds to nearest even."""
  import triton.language as tl
  from triton.runtime import interpreter
  builder = interpreter.InterpreterBuilder
  create_dot, cast_impl = builder.create_dot, builder.cast_impl
  widen = lambda h: (interpreter.TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32),
                                              tl.float32) if h.dtype == tl.bfloat16 else h)

  def dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    return create_dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

  def cast(self, src, dst_type):
    if src.dtype.scalar != tl.float32 or dst_type.scalar != tl.bfloat16:
      return cast_impl(self, src, dst_type)
    bits = np.ascontiguousarray(src.data, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    rounded = np.where(np.isnan(src.data), np.uint16(0x7FC0), rounded)
    return interpreter.TensorHandle(rounded, tl.bfloat16)

  builder.create_dot, builder.cast_impl = dot, cast


def _worker(path):
  import importlib.util
  import torch
  _bf16_as_on_a_gpu()
  spec = importlib.util.spec_from_file_location("triton_kernels", path)
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
_LOCK = threading.Lock()  # under shard_map each device's callback runs on its own thread


def _process():
  global _PROCESS
  if _PROCESS is None or _PROCESS.poll() is not None:
    env = dict(os.environ, TRITON_INTERPRET="1", JAX_PLATFORMS="cpu")
    _PROCESS = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker",
                                 _kernels_path()],
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
  outputs = [(tuple(t.shape), np.dtype(t.dtype).name) for t in out_types]
  request = (kernel_name, tuple(grid), [_pack(a) for a in arrays], outputs, constexprs)
  with _LOCK:
    process = _process()
    _send(process.stdin, request)
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


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
  _worker(sys.argv[2])

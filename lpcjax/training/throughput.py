"""Model FLOPs utilisation: what train.py logs (``mfu``) and benchmarks/train_step.py prints.

MFU = the model's training FLOPs per second (its family's ``flops_per_unit`` estimate times the
units per second) over the peak of the devices that ran them. The peak is known for a few
accelerators (dense bf16, per device); elsewhere (CPU, an unlisted GPU) MFU is not computed.
"""

PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}  # dense bf16 TFLOP/s per device


def peak_flops(devices, peak_tflops=None):
  """FLOP/s of ``devices`` together: ``peak_tflops`` per device if given, else the table's
  entry for their kind; None when unknown."""
  kind = devices[0].device_kind
  per_device = peak_tflops or next((value for name, value in PEAK_TFLOPS.items() if name in kind), None)
  return per_device * 1e12 * len(devices) if per_device else None


def mfu(flops_per_unit, units_per_sec, peak):
  """The fraction of ``peak`` FLOP/s the model's own FLOPs reach; None when either is unknown."""
  if not flops_per_unit or not peak:
    return None
  return flops_per_unit * units_per_sec / peak

"""Tensor names and layouts: PyTorch state dicts <-> lpcjax params of the transformer/fox families.

One table per format lists, for a layer, each lpcjax param (its path inside the layer), the
PyTorch tensor it corresponds to and the layout change between them; the same table serves the
import and the export, so the two cannot drift apart. Every change is a transpose or a reshape:
a round trip is exact.

PyTorch Linear weights are [out, in]; lpcjax kernels are [in, out], with the head axis split out
where the model has one (q/k/v/gate projections [d, heads, head_dim], o_proj [heads, head_dim, d]).
The official MLP holds the gate and up projections in one [2 * hidden, d] matrix (gate first);
it is split into two virtual tensors on import and joined again on export.
"""

import numpy as np

from lpcjax.layers.forget_gate import geometric_timescales, timescale_bias

from .hf_files import ConvertError

LAYER_PREFIX = "model.layers.{}."
FUSED_MLP = "mlp.gate_proj.weight"
GATE, UP = "mlp.gate_proj.weight", "mlp.up_proj.weight"


def _layouts(cfg):
  """{kind: (torch -> lpcjax, lpcjax -> torch)} for this model's shapes."""
  d, heads, kv_heads, head_dim = cfg.d_model, cfg.num_heads, cfg.resolved_kv_heads, cfg.resolved_head_dim
  to_heads = lambda n: (lambda t: t.T.reshape(d, n, head_dim), lambda a: a.reshape(d, n * head_dim).T)
  per_head = lambda n: (lambda t: t.reshape(n, head_dim), lambda a: a.reshape(n * head_dim))
  return {
      "copy": (lambda t: t, lambda a: a),
      "dense": (lambda t: t.T, lambda a: a.T),  # Linear [out, in] <-> kernel [in, out]
      "to_heads": to_heads(heads),
      "to_kv_heads": to_heads(kv_heads),  # k/v: [kv_heads * head_dim, d] (grouped-query attention)
      "from_heads": (lambda t: t.T.reshape(heads, head_dim, d), lambda a: a.reshape(heads * head_dim, d).T),
      "per_head": per_head(heads),
      "per_kv_head": per_head(kv_heads),
      # a scale shared by the heads, written where the PyTorch model has one per head
      "tile_heads": (None, lambda a: np.tile(a, heads)),
      "tile_kv_heads": (None, lambda a: np.tile(a, kv_heads)),
  }


def layer_table(fmt, cfg):
  """[(lpcjax path inside a layer, PyTorch name inside a layer, layout kind)] of one layer."""
  official = fmt == "official"
  shift = official and cfg.use_kv_shift
  table = [
      (("attn_norm", "scale"), "attn_norm.weight", "copy"),
      (("mlp_norm", "scale"), "mlp_norm.weight", "copy"),
      (("attn", "q_proj", "kernel"), "attn.q_proj.weight", "to_heads"),
      # with KV-shift, the official k/v projections are ShiftLinear modules: .linear and .shift_proj
      (("attn", "k_proj", "kernel"), "attn.k_proj.linear.weight" if shift else "attn.k_proj.weight", "to_kv_heads"),
      (("attn", "v_proj", "kernel"), "attn.v_proj.linear.weight" if shift else "attn.v_proj.weight", "to_kv_heads"),
      (("attn", "o_proj", "kernel"), "attn.o_proj.weight", "from_heads"),
      (("mlp", "w_gate", "kernel"), GATE, "dense"),
      (("mlp", "w_up", "kernel"), UP, "dense"),
      (("mlp", "w_out", "kernel"), "mlp.down_proj.weight", "dense"),
  ]
  if shift:
    table += [(("attn", "k_shift", "gate", "kernel"), "attn.k_proj.shift_proj.weight", "dense"),
              (("attn", "v_shift", "gate", "kernel"), "attn.v_proj.shift_proj.weight", "dense")]
  if cfg.use_qk_norm:
    kind = "copy" if cfg.qk_norm_shared_scale else "per_head"
    if not official and cfg.qk_norm_shared_scale:
      kind = "tile_heads"  # fla's QK-norm always has one scale per channel of every head
    # k's per-head scales are per key/value head (fla's k_norm: a GroupNorm over kv_heads groups)
    k_kind = {"per_head": "per_kv_head", "tile_heads": "tile_kv_heads"}.get(kind, kind)
    table += [(("attn", "q_norm", "scale"), "attn.q_norm.weight", kind),
              (("attn", "k_norm", "scale"), "attn.k_norm.weight", k_kind)]
  if cfg.use_output_gate:
    table.append((("attn", "g_proj", "kernel"), "attn.ogate_proj.weight" if official else "attn.g_proj.weight",
                  "to_heads"))
  if cfg.use_output_norm:
    table.append((("attn", "o_norm", "scale"), "attn.output_norm.weight", "per_head"))
  gate = getattr(cfg, "forget_gate", "none")
  if gate == "data_dependent":
    proj = "attn.fgate_proj" if official else "attn.f_proj"
    table += [(("attn", "forget_gate", "proj", "kernel"), f"{proj}.weight", "dense"),
              (("attn", "forget_gate", "proj", "bias"), f"{proj}.bias", "copy")]
  elif gate == "data_independent":
    table.append((("attn", "forget_gate", "bias"), "attn.fgate_bias", "copy"))
  return table


def global_table(cfg):
  table = [(("embed", "embedding"), "model.embeddings.weight", "copy"),
           (("final_norm", "scale"), "model.norm.weight", "copy")]
  if not cfg.tie_embeddings:
    table.append((("lm_head", "kernel"), "lm_head.weight", "dense"))
  return table


def _fixed_gate_bias(cfg):
  """The per-head bias of lpcjax's fixed gate (not a param: computed from gate_t_min/max)."""
  return timescale_bias(geometric_timescales(cfg.num_heads, cfg.gate_t_min, cfg.gate_t_max)).astype(np.float32)


def _set(tree, path, value):
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def _get(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def _take(tensors, name):
  if name not in tensors:
    raise ConvertError(f"missing tensor {name}")
  return tensors.pop(name)


def to_params(fmt, cfg, tensors):
  """lpcjax params (nested dicts of float32 numpy arrays, layers stacked on a leading axis, as
  ``nn.scan`` holds them) from a PyTorch state dict, which is emptied on the way (a 760M model
  is then held once, not twice). Every tensor must be used: one left over means the checkpoint
  has something this model does not (named in the error)."""
  layouts = _layouts(cfg)
  params = {}
  for path, name, kind in global_table(cfg):
    _set(params, path, layouts[kind][0](_take(tensors, name)))
  if cfg.tie_embeddings:
    tensors.pop("lm_head.weight", None)  # a tied copy, when the saver kept one
  layers = []
  for i in range(cfg.num_layers):
    prefix = LAYER_PREFIX.format(i)
    if fmt == "official":
      fused = _take(tensors, prefix + FUSED_MLP)
      hidden = fused.shape[0] // 2
      tensors[prefix + GATE], tensors[prefix + UP] = fused[:hidden], fused[hidden:]
    layer = {}
    for path, name, kind in layer_table(fmt, cfg):
      _set(layer, path, layouts[kind][0](_take(tensors, prefix + name)))
    if getattr(cfg, "forget_gate", None) == "fixed":
      _check_fixed_gate(cfg, tensors.pop(prefix + "attn.fgate_bias", None), prefix)
    layers.append(layer)
  for name in list(tensors):
    if name.endswith("rotary.inv_freq"):  # a cache of RoPE frequencies some savers keep
      del tensors[name]
  if tensors:
    raise ConvertError(f"unexpected tensor {sorted(tensors)[0]} ({len(tensors)} in all): the checkpoint has a part "
                       "this model does not")
  params["layers"] = _stack(layers)
  return params


def _check_fixed_gate(cfg, stored, prefix):
  """The official fixed gate is a stored buffer; lpcjax computes the same T(b) values."""
  if stored is None:
    return
  expected = _fixed_gate_bias(cfg)
  if stored.shape != expected.shape or not np.allclose(stored, expected, rtol=1e-5, atol=1e-6):
    raise ConvertError(f"{prefix}attn.fgate_bias: the fixed gate's values are not the geometric T(b) init with "
                       f"decay_time_min={cfg.gate_t_min}, decay_time_max={cfg.gate_t_max}")


def _stack(layers, path=("layers",)):
  """Per-layer trees -> one tree of [num_layers, ...] arrays; layers must agree in shape."""
  if isinstance(layers[0], dict):
    return {key: _stack([layer[key] for layer in layers], path + (key,)) for key in layers[0]}
  for i, array in enumerate(layers):
    if array.shape != layers[0].shape:
      name = "".join(f"[{key!r}]" for key in path)
      raise ConvertError(f"{name}: layer {i}'s tensor has shape {array.shape}, layer 0's {layers[0].shape}")
  return np.stack(layers)


def _layer(params, cfg, i):
  """Layer i's params, from a scanned stack or from unrolled blocks (``scan_layers=False``)."""
  stacked = params["layers"]
  if f"block_{i}" in stacked:
    return stacked[f"block_{i}"]
  return _index(stacked, i)


def _index(tree, i):
  return {k: _index(v, i) for k, v in tree.items()} if isinstance(tree, dict) else tree[i]


def from_params(fmt, cfg, params):
  """The PyTorch state dict (float32 numpy arrays) of lpcjax params."""
  layouts = _layouts(cfg)
  tensors = {}
  for path, name, kind in global_table(cfg):
    tensors[name] = layouts[kind][1](_as_float32(_get(params, path)))
  for i in range(cfg.num_layers):
    prefix = LAYER_PREFIX.format(i)
    layer = _layer(params, cfg, i)
    for path, name, kind in layer_table(fmt, cfg):
      tensors[prefix + name] = layouts[kind][1](_as_float32(_get(layer, path)))
    if fmt == "official":
      tensors[prefix + FUSED_MLP] = np.concatenate([tensors.pop(prefix + GATE), tensors.pop(prefix + UP)], axis=0)
    if getattr(cfg, "forget_gate", None) == "fixed":
      tensors[prefix + "attn.fgate_bias"] = _fixed_gate_bias(cfg)
  return tensors


def _as_float32(array):
  return np.asarray(array, dtype=np.float32)

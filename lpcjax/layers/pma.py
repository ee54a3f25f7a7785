"""Progressive Memory Attention (PMA), the layer of the PMT encoder (the PMT spec §3–§6).

A PMA block cuts its K tokens into N = ⌊(K − W)/S⌋ + 1 overlapping windows of W tokens (window
w starts at token wS) and runs one pre-norm transformer layer per window over
``[M_prev; M_cur; X_w]``:

* ``M_prev`` (n_m slots), the horizontal carrier: the updated memory of window w − 1 of this
  block (a learned start state for w = 0);
* ``M_cur`` (n_m slots), fresh write slots: RMSNorm(M̃ + g (M_0 − M̃)) with M̃ the memory of the
  same window in the block below and g = σ(θ) the reset/carry gate (block 1: RMSNorm(M_0));
* ``X_w``, the window's tokens, rotated by RoPE at their absolute index (slots are not rotated).

Masks: a token sees the tokens before it in the window and ``M_prev``, never ``M_cur``; a
write slot sees every valid token of the window, ``M_cur`` and (``state_attends_prev``)
``M_prev``. The write gate then mixes the candidate RMSNorm(out[M_cur]) into the carrier:
M_w = RMSNorm(M̄ + u (M̂ − M̄)), M̄ = RMSNorm(M_prev), u = σ((W_u [mean M̄; mean M̂; mean X_w] + b_u)/T_u)
(W_u = 0, b_u = −2, T_u = 2 at init). A read path adds σ(W_r m̄ + b_r) (W_p m̄ + b_p) to the
token outputs (m̄ = mean of M̄; starts closed: W_r = W_p = b_p = 0, b_r = −2).

Choice (documented deviation): the write gate summarizes the window by the mean of its *input*
tokens, not of the token outputs as the later code does. The memory recurrence then does not
depend on the token rows, so the vectorized mode runs the cheap recurrence (n_m query rows per
window) as a scan and all token rows of all windows in one parallel pass; with the token
outputs in the gate every window would wait for the full layer of the one before.

Each position lies in up to O = ⌈W/S⌉ windows. The overlap aggregator (§5) merges its copies:
single-query attention (query = the masked mean of the copies) over the copies with a learned
head × copy bias, scaled by 1/√(number of copies), RMS-normalized, times γ; fused with the
masked-mean skip through the SkipGate: s + σ(θ_s) ã. The block adds fused − x_in to its residual
stream, so the SkipGate gates the aggregator's term (the paper's wording) while the mean of the
copies enters ungated (the later code gated the whole window update instead). The 1/√count
scaling before the RMSNorm changes nothing but the norm's ε; it is kept as the paper states it.
Copy o of a position comes from the o-th latest window containing it (o = 0: the window in
which it has the least context). Tokens after
the last window (when S does not divide K − W) are in no window: their PMA update is zero.

The encoder is not causal: the memories are written bidirectionally within a window and a
token reads the carrier of the window before, which saw up to W − S − 1 tokens after it; the
history bound holds for the memories (window w's memory reads no token after window w's end).

Two execution modes compute the same function (tests check 1e-5):
* vectorized: all windows gathered at once ([batch, N, W, d], the overlaps materialized);
* streaming (``streaming=True``): a scan over windows that slices its W tokens, keeps the last
  O window outputs and emits the S positions no later window covers: O(W + n_m) working memory
  per step instead of O(O K).
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from .common import RMSNorm, constant_init, normal_init
from .configs import PMAConfig, num_windows  # noqa: F401  (PMAConfig: re-exported, the layer's config)
from .rope import apply_rope

NO_POSITION = -1  # rows that RoPE leaves alone (memory slots)
_MASKED = -1e30


def rotate_rows(x, positions, theta):
  """RoPE on x [..., rows, heads, dh] at ``positions`` [..., rows]; rows at NO_POSITION stay."""
  lead = x.shape[:-3]
  positions = jnp.broadcast_to(positions, lead + x.shape[-3:-2])
  flat_x = x.reshape((-1,) + x.shape[-3:])
  flat_pos = positions.reshape((-1, x.shape[-3]))
  rotated = apply_rope(flat_x, jnp.maximum(flat_pos, 0), theta).reshape(x.shape)
  return jnp.where((positions >= 0)[..., None, None], rotated, x)


class EncoderLayer(nn.Module):
  """A pre-norm transformer layer whose queries and keys may be different row sets:
  out = a + MLP(RMSNorm(a)), a = q_rows + Attn(RMSNorm(q_rows), RMSNorm(k_rows)).

  ``mask`` [..., Q, K] (True: may attend); positions [..., Q] / [..., K] rotate by RoPE
  (None or NO_POSITION: not rotated).
  """

  d_model: int
  num_heads: int
  mlp_dim: int
  dropout: float = 0.0
  rope_theta: float = 10000.0
  norm_eps: float = 1e-6

  def setup(self):
    heads, head_dim = self.num_heads, self.d_model // self.num_heads
    std = 0.02
    self.attn_norm = RMSNorm(self.norm_eps)
    self.mlp_norm = RMSNorm(self.norm_eps)
    self.query, self.key, self.value = (
        self.param(name, normal_init(std, ("embed", "heads", "head_dim")), (self.d_model, heads, head_dim))
        for name in ("query", "key", "value"))
    self.out = self.param("out", normal_init(std, ("heads", "head_dim", "embed")), (heads, head_dim, self.d_model))
    self.mlp_in = nn.Dense(self.mlp_dim, kernel_init=normal_init(std, ("embed", "mlp")))
    self.mlp_out = nn.Dense(self.d_model, kernel_init=normal_init(std, ("mlp", "embed")))
    self.drop = nn.Dropout(self.dropout)

  def __call__(self, q_rows, k_rows, mask, q_pos=None, k_pos=None, train=False):
    hq, hk = self.attn_norm(q_rows), self.attn_norm(k_rows)
    q = jnp.einsum("...d,dhe->...he", hq, self.query)
    k = jnp.einsum("...d,dhe->...he", hk, self.key)
    v = jnp.einsum("...d,dhe->...he", hk, self.value)
    if q_pos is not None:
      q = rotate_rows(q, q_pos, self.rope_theta)
    if k_pos is not None:
      k = rotate_rows(k, k_pos, self.rope_theta)
    logits = jnp.einsum("...qhe,...khe->...hqk", q, k) / math.sqrt(q.shape[-1])
    logits = jnp.where(mask[..., None, :, :], logits, _MASKED)
    attended = jnp.einsum("...hqk,...khe->...qhe", jax.nn.softmax(logits, axis=-1), v)
    a = q_rows + self.drop(jnp.einsum("...he,hed->...d", attended, self.out), deterministic=not train)
    hidden = self.drop(nn.gelu(self.mlp_in(self.mlp_norm(a))), deterministic=not train)
    return a + self.drop(self.mlp_out(hidden), deterministic=not train)


class OverlapAggregator(nn.Module):
  """Merges the copies [..., O, d] of a position (``mask`` [..., O]) into one row [..., d]:
  s + σ(θ_s) γ RMSNorm(agg / √count), s = mean of the valid copies, agg = single-query
  multi-head attention of s over the copies with a learned head × copy bias. Positions without
  a valid copy get s = 0 (the caller ignores them)."""

  num_heads: int
  num_copies: int
  gamma: float = 1.0
  skip_gate_logit: float = -0.5
  norm_eps: float = 1e-6

  @nn.compact
  def __call__(self, copies, mask):
    d = copies.shape[-1]
    heads, head_dim = self.num_heads, d // self.num_heads
    weights = mask.astype(copies.dtype)
    count = weights.sum(-1)
    skip = (copies * weights[..., None]).sum(-2) / jnp.maximum(count, 1.0)[..., None]
    project = lambda name, axes, shape: self.param(name, normal_init(0.02, axes), shape)
    q = jnp.einsum("...d,dhe->...he", skip, project("query", ("embed", "heads", "head_dim"), (d, heads, head_dim)))
    k = jnp.einsum("...od,dhe->...ohe", copies, project("key", ("embed", "heads", "head_dim"), (d, heads, head_dim)))
    v = jnp.einsum("...od,dhe->...ohe", copies, project("value", ("embed", "heads", "head_dim"), (d, heads, head_dim)))
    bias = self.param("copy_bias", constant_init(0.0, ("heads", None)), (heads, self.num_copies))
    logits = jnp.einsum("...he,...ohe->...ho", q, k) / math.sqrt(head_dim) + bias
    logits = jnp.where(mask[..., None, :], logits, _MASKED)
    mixed = jnp.einsum("...ho,...ohe->...he", jax.nn.softmax(logits, axis=-1), v)
    agg = jnp.einsum("...he,hed->...d", mixed, project("out", ("heads", "head_dim", "embed"), (heads, head_dim, d)))
    agg = agg / jnp.sqrt(jnp.maximum(count, 1.0))[..., None]
    gamma = self.param("gamma", constant_init(self.gamma, ()), ())
    gate = jax.nn.sigmoid(self.param("skip_gate", constant_init(self.skip_gate_logit, ()), ()))
    return skip + gate * gamma * RMSNorm(self.norm_eps, name="post_norm")(agg)


# ----------------------------------------------------------------------------- geometry


def max_copies(window, stride):
  """O = ⌈W/S⌉: the most windows a position can lie in."""
  return -(-window // stride)


def copy_layout(num_tokens, window, stride):
  """Static indices of the copies of each position p: copy o comes from window
  w = min(N − 1, ⌊p/S⌋) − o at offset p − wS. Returns (window, offset, exists), each [K, O]."""
  n = num_windows(num_tokens, window, stride)
  o = np.arange(max_copies(window, stride))
  p = np.arange(num_tokens)[:, None]
  w = np.minimum(n - 1, p // stride) - o
  offset = p - w * stride
  exists = (w >= 0) & (offset < window)
  return np.where(exists, w, 0), np.where(exists, offset, 0), exists


def window_tokens(x, window, stride, n):
  """x [batch, K, ...] -> the windows [batch, N, W, ...] (gathered copies)."""
  index = np.arange(n)[:, None] * stride + np.arange(window)
  return x[:, index]


def masked_mean(x, valid, axis):
  """Mean of x over ``axis`` where ``valid`` (x [..., d], valid without the d axis)."""
  weights = valid.astype(x.dtype)[..., None]
  return (x * weights).sum(axis) / jnp.maximum(weights.sum(axis), 1.0)


# ----------------------------------------------------------------------------- the block


class PMABlock(nn.Module):
  """One PMA block: x [batch, K, d], valid [batch, K] (bool), ``lower`` the block below's
  memories [batch, N, n_m, d] (None: first block) -> (x_out [batch, K, d], memories
  [batch, N, n_m, d]). x_in = N1(x); x += PMA update; x_out = N3(h + MLP(h)), h = N2(x)."""

  config: PMAConfig
  window: int
  stride: int

  def setup(self):
    cfg = self.config
    shape = (cfg.num_slots, cfg.d_model)
    self.layer = EncoderLayer(cfg.d_model, cfg.num_heads, cfg.mlp_dim, cfg.dropout, cfg.rope_theta, cfg.norm_eps)
    self.in_norm, self.mid_norm, self.out_norm, self.state_norm = (RMSNorm(cfg.norm_eps) for _ in range(4))
    self.start_state = self.param("start_state", normal_init(0.02, (None, "embed")), shape)
    self.base_state = self.param("base_state", normal_init(cfg.base_state_std, (None, "embed")), shape)
    self.carry_logit = self.param("carry_gate", constant_init(cfg.carry_gate_logit, ()), ())
    zeros = nn.initializers.zeros
    self.write = nn.Dense(1, kernel_init=zeros, bias_init=nn.initializers.constant(cfg.write_gate_bias))
    self.read_gate = nn.Dense(1, kernel_init=zeros, bias_init=nn.initializers.constant(cfg.read_gate_bias))
    self.read_value = nn.Dense(cfg.d_model, kernel_init=zeros)
    self.mlp_in = nn.Dense(cfg.mlp_dim, kernel_init=normal_init(0.02, ("embed", "mlp")))
    self.mlp_out = nn.Dense(cfg.d_model, kernel_init=normal_init(0.02, ("mlp", "embed")))
    self.drop = nn.Dropout(cfg.dropout)
    self.aggregator = OverlapAggregator(cfg.num_heads, max_copies(self.window, self.stride), cfg.aggregator_gamma,
                                        cfg.skip_gate_logit, cfg.norm_eps)

  # -- the pieces of one window; leading axes are [batch] or [batch, windows]

  def write_slots(self, lower, noise):
    """M_cur for every window [batch, N, n_m, d] from the block below (None: from M_0 alone)."""
    base = self.base_state + noise
    if lower is None:
      return self.state_norm(base)
    cfg = self.config
    gate = jax.nn.sigmoid(self.carry_logit) if cfg.carry_gate else 1.0 - cfg.carry_mix
    return self.state_norm(lower + gate * (base - lower))

  def memory_rows(self, prev, cur, tokens, positions, valid, train):
    """The write: new memory [..., n_m, d] of a window from its carrier, write slots, tokens."""
    n = self.config.num_slots
    keys = jnp.concatenate([prev, cur, tokens], axis=-2)
    key_pos = jnp.concatenate([jnp.full(positions.shape[:-1] + (2 * n,), NO_POSITION), positions], -1)
    lead = valid.shape[:-1]
    allowed = jnp.concatenate([jnp.full(lead + (n,), self.config.state_attends_prev), jnp.ones(lead + (n,), bool),
                               valid], axis=-1)
    mask = jnp.broadcast_to(allowed[..., None, :], lead + (n, keys.shape[-2]))
    candidate = self.state_norm(self.layer(cur, keys, mask, None, key_pos, train))
    if not self.config.write_gate:
      return candidate
    carried = self.state_norm(prev)
    summary = jnp.concatenate([carried.mean(-2), candidate.mean(-2), masked_mean(tokens, valid, -2)], -1)
    u = jax.nn.sigmoid(self.write(summary) / self.config.write_gate_temperature)[..., None, :]
    self.sow("intermediates", "write_opening", u)  # gate_openings: what the gate does (its bias does not say)
    return self.state_norm(carried + u * (candidate - carried))

  def token_rows(self, prev, tokens, positions, valid, train):
    """Token outputs [..., W, d]: causal within the window, reading the carrier, not M_cur."""
    n, w = self.config.num_slots, tokens.shape[-2]
    keys = jnp.concatenate([prev, tokens], axis=-2)
    key_pos = jnp.concatenate([jnp.full(positions.shape[:-1] + (n,), NO_POSITION), positions], -1)
    causal = np.tril(np.ones((w, w), bool))
    token_keys = (causal & valid[..., None, :]) | np.eye(w, dtype=bool)  # the diagonal: no empty row
    mask = jnp.concatenate([jnp.ones(token_keys.shape[:-1] + (n,), bool), token_keys], axis=-1)
    out = self.layer(tokens, keys, mask, positions, key_pos, train)
    carried = self.state_norm(prev).mean(-2)
    opening = jax.nn.sigmoid(self.read_gate(carried))
    self.sow("intermediates", "read_opening", opening)
    read = opening * self.read_value(carried)
    return out + read[..., None, :]

  # -- the two execution modes

  def __call__(self, x, valid, lower=None, train=False):
    cfg = self.config
    batch, k, d = x.shape
    n = num_windows(k, self.window, self.stride)
    x_in = self.in_norm(x)
    noise = jnp.zeros((batch, n) + self.base_state.shape, x.dtype)
    if train and cfg.state_noise > 0:
      noise = cfg.state_noise * jax.random.normal(self.make_rng("dropout"), noise.shape, x.dtype)
    stateless = cfg.memory == "stateless"
    cur = self.write_slots(None if stateless else lower, noise)
    start = jnp.broadcast_to(self.start_state, (batch,) + self.start_state.shape)
    run = self._streaming if cfg.streaming else self._vectorized
    update, memories = run(x_in, valid, cur, start, stateless, train)
    x = x + update
    h = self.mid_norm(x)
    h = h + self.drop(self.mlp_out(self.drop(nn.gelu(self.mlp_in(h)), deterministic=not train)),
                      deterministic=not train)
    return self.out_norm(h), memories

  def _vectorized(self, x_in, valid, cur, start, stateless, train):
    batch, k, _ = x_in.shape
    n = num_windows(k, self.window, self.stride)
    tokens = window_tokens(x_in, self.window, self.stride, n)
    token_valid = window_tokens(valid, self.window, self.stride, n)
    positions = jnp.asarray(window_tokens(np.arange(k)[None], self.window, self.stride, n)[0])
    if stateless:
      prev = jnp.broadcast_to(start[:, None], cur.shape)
      memories = self.memory_rows(prev, cur, tokens, positions, token_valid, train)
    else:
      def step(block, carry, inputs):
        cur_w, tokens_w, positions_w, valid_w = inputs
        new = block.memory_rows(carry, cur_w, tokens_w, positions_w, valid_w, train)
        return new, new
      scan = nn.scan(step, variable_broadcast="params", variable_axes={"intermediates": 0},
                   split_rngs={"params": False, "dropout": True})
      swap = lambda a: jnp.swapaxes(a, 0, 1)
      _, memories = scan(self, start, (swap(cur), swap(tokens), positions, swap(token_valid)))
      memories = swap(memories)
      prev = jnp.concatenate([start[:, None], memories[:, :-1]], axis=1)
    outputs = self.token_rows(prev, tokens, positions, token_valid, train)
    window_of, offset, exists = copy_layout(k, self.window, self.stride)
    copies = outputs[:, window_of, offset]  # [batch, K, O, d]
    copy_mask = exists & valid[..., None]
    fused = self.aggregator(copies, copy_mask)
    return jnp.where(copy_mask.any(-1)[..., None], fused - x_in, 0.0), memories

  def _streaming(self, x_in, valid, cur, start, stateless, train):
    batch, k, d = x_in.shape
    window, stride = self.window, self.stride
    n, o = num_windows(k, window, stride), max_copies(window, stride)
    copy_index = np.arange(o)

    def finalize(block, buffer, newest, first, count, offset):
      """The update of positions first + [0, count), at ``offset`` + [0, count) in their latest
      window ``newest``: copy o comes from window newest - o, held in buffer slot O - 1 - o."""
      rel = offset + np.arange(count)[:, None] + copy_index * stride  # offset in window newest - o
      exists = jnp.asarray(rel < window) & (newest - copy_index >= 0)
      copies = buffer[o - 1 - copy_index, :, np.minimum(rel, window - 1)]  # [count, O, batch, d]
      copies = jnp.moveaxis(copies, 2, 0)
      own = jax.lax.dynamic_slice_in_dim(x_in, first, count, axis=1)
      own_valid = jax.lax.dynamic_slice_in_dim(valid, first, count, axis=1)
      copy_mask = exists & own_valid[..., None]
      return jnp.where(copy_mask.any(-1)[..., None], block.aggregator(copies, copy_mask) - own, 0.0)

    def step(block, carry, inputs):
      prev, buffer = carry
      cur_w, index = inputs
      first = index * stride
      tokens = jax.lax.dynamic_slice_in_dim(x_in, first, window, axis=1)
      token_valid = jax.lax.dynamic_slice_in_dim(valid, first, window, axis=1)
      positions = first + jnp.arange(window)
      memory = block.memory_rows(prev, cur_w, tokens, positions, token_valid, train)
      outputs = block.token_rows(prev, tokens, positions, token_valid, train)
      buffer = jnp.concatenate([buffer[1:], outputs[None]], axis=0)
      update = finalize(block, buffer, index, first, stride, 0)
      return (start if stateless else memory, buffer), (memory, update)

    scan = nn.scan(step, variable_broadcast="params", variable_axes={"intermediates": 0},
                   split_rngs={"params": False, "dropout": True})
    buffer = jnp.zeros((o, batch, window, d), x_in.dtype)
    (_, buffer), (memories, updates) = scan(self, (start, buffer), (jnp.swapaxes(cur, 0, 1), jnp.arange(n)))
    updates = jnp.moveaxis(updates, 0, 1).reshape(batch, n * stride, d)
    last = (n - 1) * stride
    rest = finalize(self, buffer, n - 1, last + stride, window - stride, stride) if window > stride else updates[:, :0]
    tail = jnp.zeros((batch, k - last - window, d), x_in.dtype)  # after the last window: no update
    return jnp.concatenate([updates, rest, tail], axis=1), jnp.swapaxes(memories, 0, 1)


class PMAStack(nn.Module):
  """``num_blocks`` PMA blocks on one window grid: x [batch, K, d], valid [batch, K] ->
  (x [batch, K, d], the last block's memories [batch, N, n_m, d]). Block b > 1 reads block
  b − 1's memory of the same window through its reset/carry gate (not in "stateless" mode)."""

  config: PMAConfig
  num_blocks: int
  window: int
  stride: int

  @nn.compact
  def __call__(self, x, valid, train=False):
    memories = None
    for b in range(self.num_blocks):
      lower = memories if self.config.memory == "progressive" else None
      x, memories = PMABlock(self.config, self.window, self.stride, name=f"block_{b}")(x, valid, lower, train)
    return x, memories


def gate_values(stack_params, write_gate_temperature=PMAConfig.write_gate_temperature):
  """{block: {gate: value}} of a PMAStack's params: the carry share σ(θ_g), the write gate's
  opening at zero input u = σ(b_u / T_u), the read gate σ(b_r), the SkipGate σ(θ_s) and γ. The
  write and read gates also have input weights; their biases are what the init sets, so they
  say whether (and where) the gates moved."""
  sigmoid = lambda v: float(1 / (1 + np.exp(-float(np.asarray(v).reshape(-1)[0]))))

  def values(block):
    gates = {"carry": sigmoid(block["carry_gate"])}
    if "write" in block:  # model.write_gate=false has no write gate
      gates["write_u0"] = sigmoid(np.asarray(block["write"]["bias"]) / write_gate_temperature)
    return {**gates, "read": sigmoid(block["read_gate"]["bias"]), "skip": sigmoid(block["aggregator"]["skip_gate"]),
            "gamma": float(np.asarray(block["aggregator"]["gamma"]))}

  return {name: values(block) for name, block in stack_params.items()}


def gate_openings(intermediates):
  """{block: {gate: value}} of the openings the gates had on a batch: the write gate's u and the
  read gate's σ(W_r m̄ + b_r), mean and std over windows and series, from the "intermediates"
  a PMAStack sows (``model.apply(variables, x, mutable=["intermediates"])[1]["intermediates"]
  ["pma"]``). What the gates do, where ``gate_values`` reads their biases: the write gate's
  input is never 0 (its summary is the mean of RMS-normalized rows), and its kernel, moved by
  Adam as fast per weight as the bias over 3d inputs, takes over its mean opening within a few
  steps while the bias stays near its init (docs/pmt_results.md, "Gates along a run")."""
  out = {}
  for name, block in intermediates.items():
    gates = {}
    for gate in ("write", "read"):
      if f"{gate}_opening" in block:  # model.write_gate=false sows no write opening
        value = np.asarray(block[f"{gate}_opening"][0])
        gates[f"{gate}_open"], gates[f"{gate}_open_std"] = float(value.mean()), float(value.std())
    out[name] = gates
  return out

"""The tables and ratios of one gpu_check.sh run, from its JSON files (all from the same run).

Reads a results folder (or the gpu_results.tar a device session returns), prints markdown
tables and writes the ratios as JSON:
  * kernels against float64: cases passed per backend, the largest error;
  * forgetting attention fwd+bwd at each T and D: TFLOP/s of every candidate, and the ratios of
    each lpcjax kernel to the best gated peer (fla, the official FoX kernel), to the cuDNN floor
    (no gate) and to lpcjax's own xla backend (time ratios: above 1 is faster);
  * pruning: each pruned kernel's speed-up over itself unpruned, beside the official ACP's;
  * training steps and cached decoding, lpcjax beside fla;
  * the compile table (results/compile_sm90.json, benchmarks/compile_check.py: registers,
    spills, shared memory per kernel, compiled without a GPU) with this run's fwd+bwd time beside
    each backend at T = 16k: what the compiler counted next to what the GPU measured.

  python benchmarks/gpu_report.py RESULTS [--json FILE]     # RESULTS: a folder or gpu_results.tar
"""

import argparse
import glob
import json
import os
import tarfile
import tempfile

from lpcjax.files import write_json_atomic

LPCJAX = ("pallas", "triton", "auto", "xla", "mosaic_gpu", "mosaic_gpu_fused", "mosaic_gpu_hw", "mosaic_gpu_v1")
GATED_PEERS = ("fla", "fox_official")
FLOOR = "cudnn_nobias"


def load(folder):
  """file stem -> its JSON, for every JSON file of the folder."""
  paths = sorted(glob.glob(os.path.join(folder, "*.json")))
  return {os.path.basename(path)[:-5]: json.load(open(path)) for path in paths}


def attention_rows(results, stem_prefix):
  return [row for stem, result in results.items() if stem.startswith(stem_prefix) for row in result.get("rows", [])]


def timed(rows, **where):
  """(candidate, head_dim, seq_len, gate timescale) -> fwd+bwd ms of the rows that ran."""
  return {(r["candidate"], r["head_dim"], r["seq_len"], r.get("gate_timescale")): r["forward_backward_ms"]
          for r in rows if "forward_backward_ms" in r and all(r.get(k) == v for k, v in where.items())}


def speed_table(rows):
  """Markdown rows (D, T, candidate, fwd+bwd TF/s, ms) and the ratio records, ungated-timescale rows."""
  times = timed(rows, gate_timescale=None)
  tflops = {(r["candidate"], r["head_dim"], r["seq_len"]): r["forward_backward_tflops"]
            for r in rows if "forward_backward_tflops" in r and r.get("gate_timescale") is None}
  shapes = sorted({key[1:3] for key in times})
  lines = ["| D | T | candidate | fwd+bwd TFLOP/s | fwd+bwd ms | ÷ best gated peer | ÷ cuDNN floor | ÷ xla |",
           "|---|---|---|---|---|---|---|---|"]
  ratios = []
  for head_dim, seq_len in shapes:
    at = {name: ms for (name, d, t, _), ms in times.items() if (d, t) == (head_dim, seq_len)}
    peers = {name: at[name] for name in GATED_PEERS if name in at}
    best_peer = min(peers, key=peers.get) if peers else None
    for name in sorted(at, key=at.get):
      cells = ["", "", ""]
      if name in LPCJAX:
        # a ratio of times: peer ms / ours ms (> 1: ours is faster)
        record = {"head_dim": head_dim, "seq_len": seq_len, "kernel": name, "best_peer": best_peer}
        for i, (key, other) in enumerate((("vs_best_peer", best_peer), ("vs_cudnn_floor", FLOOR), ("vs_xla", "xla"))):
          if other in at and other != name:
            record[key] = at[other] / at[name]
            cells[i] = f"{record[key]:.2f}" + (f" ({other})" if key == "vs_best_peer" else "")
        ratios.append(record)
      lines.append(f"| {head_dim} | {seq_len} | {name} | {tflops[(name, head_dim, seq_len)]:.1f} | {at[name]:.2f} | "
                   + " | ".join(cells) + " |")
  return lines, ratios


def pruning_table(rows):
  times = timed(rows)
  fractions = {(r["candidate"], r["gate_timescale"]): r.get("skipped_tile_fraction") for r in rows}
  lines = ["| τ | kernel | fwd+bwd ms | pruned ms | speed-up | tiles skipped |", "|---|---|---|---|---|---|"]
  records = []
  for (name, head_dim, seq_len, tau), ms in sorted(times.items(), key=lambda item: (item[0][3], item[0][0])):
    pruned_name = {"pallas": "pallas_pruned", "triton": "triton_pruned", "fox_official": "fox_official_acp"}.get(name)
    pruned = times.get((pruned_name, head_dim, seq_len, tau))
    if pruned is None:
      continue
    fraction = fractions.get((pruned_name, tau))
    records.append({"kernel": name, "gate_timescale": tau, "seq_len": seq_len, "head_dim": head_dim,
                    "speedup": ms / pruned, "skipped_tile_fraction": fraction})
    lines.append(f"| {tau:g} | {name} | {ms:.2f} | {pruned:.2f} | {ms / pruned:.2f} | "
                 + (f"{fraction:.0%} |" if fraction is not None else "– |"))
  return lines, records


def check_table(results):
  rows = results.get("kernel_check_gpu", {}).get("rows", [])
  lines = ["| backend | cases passed | largest error (case, array) |", "|---|---|---|"]
  for impl in dict.fromkeys(row["impl"] for row in rows):
    mine = [row for row in rows if row["impl"] == impl]
    errors = [(e, row["case"], name) for row in mine for name, e in row.get("errors", {}).items()]
    worst = max(errors) if errors else None
    crashed = [row["case"] for row in mine if "error" in row]
    ran = [row for row in mine if row["passed"] is not None]
    lines.append(f"| {impl} | {sum(row['passed'] for row in ran)} of {len(ran)} | "
                 + (f"{worst[0]:.1e} ({worst[1]}, {worst[2]})" if worst else "–")
                 + (f"; crashed: {', '.join(crashed)}" if crashed else "") + " |")
  return lines


def step_table(results):
  lines = ["| model | step ms | units/s | MFU |", "|---|---|---|---|"]
  for stem, result in results.items():
    if stem.startswith("train_step"):
      for row in result["rows"]:
        rate = next((v for k, v in row.items() if k.endswith("_per_sec")), None)
        mfu = f"{row['mfu']:.1%}" if row.get("mfu") is not None else "–"
        lines.append(f"| {row['family']} ({result['config']}) | {row['step_ms']:.1f} | {rate:,.0f} | {mfu} |")
  return lines


def decode_table(results):
  ours = {(r["batch"], r["prompt_len"]): r for r in results.get("decode_gpu", {}).get("rows", [])}
  fla = {(r["batch"], r["prompt_len"]): r for r in results.get("decode_peers_gpu", {}).get("rows", [])}
  lines = ["| batch | prompt | lpcjax tok/s | fla tok/s | lpcjax ÷ fla |", "|---|---|---|---|---|"]
  records = []
  for key in sorted(set(ours) | set(fla)):
    a, b = ours.get(key, {}).get("cached_tokens_per_s"), fla.get(key, {}).get("tokens_per_s")
    ratio = a / b if a and b else None
    records.append({"batch": key[0], "prompt_len": key[1], "lpcjax_tokens_per_s": a, "fla_tokens_per_s": b,
                    "ratio": ratio})
    cell = lambda x, row: f"{x:,.0f}" if x else row.get("error", "–")[:40]
    lines.append(f"| {key[0]} | {key[1]} | {cell(a, ours.get(key, {}))} | {cell(b, fla.get(key, {}))} | "
                 f"{f'{ratio:.2f}' if ratio else '–'} |")
  return lines, records


COMPILE_TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "compile_sm90.json")


def compile_runtime_table(rows, compile_path=COMPILE_TABLE):
  """Markdown rows: each backend's kernels at T = 16k, bf16 (no window, segments or pruning) as
  compiled ahead of time, with the fwd+bwd time this run measured for that backend and D."""
  if not os.path.exists(compile_path):
    return ["(no compile table: run benchmarks/compile_check.py)"]
  with open(compile_path) as f:
    compiled = json.load(f)["rows"]
  times = timed(rows, gate_timescale=None)
  lines = ["| backend | D | kernel | registers | spill B (st/ld) | SMEM KiB | fwd+bwd ms (this run, T = 16k) |",
           "|---|---|---|---|---|---|---|"]
  for row in compiled:
    plain = not (row.get("window") or row.get("segments") or row.get("prune") or row.get("kv_heads"))
    if row.get("kind") != "attention" or not row.get("compiled") or row["seq_len"] != 16384 or not plain:
      continue
    ms = times.get((row["impl"], row["head_dim"], 16384, None))
    for kernel in row["kernels"]:
      smem = kernel.get("smem_bytes")
      lines.append(f"| {row['impl']} | {row['head_dim']} | {kernel['name']} | {kernel['registers']} | "
                   f"{kernel['spill_store_bytes']}/{kernel['spill_load_bytes']} | "
                   f"{'–' if smem is None else f'{smem / 1024:.0f}'} | {'–' if ms is None else f'{ms:.2f}'} |")
  return lines


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("results", help="a results folder or a gpu_results.tar")
  parser.add_argument("--json", default=None, help="where to write the ratios (default: none)")
  args = parser.parse_args()
  folder = args.results
  if os.path.isfile(folder):
    folder = tempfile.mkdtemp()
    with tarfile.open(args.results) as archive:
      archive.extractall(folder, filter="data")
  results = load(folder)
  rows = attention_rows(results, "attention_gpu") + attention_rows(results, "attention_peers_gpu")
  speed_lines, speed_ratios = speed_table(rows)
  prune_lines, prune_records = pruning_table(attention_rows(results, "attention_pruning_gpu")
                                             + attention_rows(results, "attention_peers_pruning_gpu"))
  decode_lines, decode_records = decode_table(results)
  sections = [("Kernels against float64 (compiled)", check_table(results)),
              ("Forgetting attention, forward + backward, bf16, causal", speed_lines),
              ("Pruning at T = 16k, D = 128", prune_lines),
              ("Compiled kernels (sm_90a, no GPU) beside the measured time", compile_runtime_table(rows)),
              ("Training steps", step_table(results)),
              ("Cached decoding, FoX (Pro) 125M", decode_lines)]
  for title, lines in sections:
    print(f"\n#### {title}\n")
    print("\n".join(lines))
  if args.json:
    source = next(iter(results.values()), {})
    write_json_atomic(args.json, {"device": source.get("device"), "attention": speed_ratios,
                                  "pruning": prune_records, "decode": decode_records,
                                  "ratios": "time ratios: other ms / lpcjax ms (above 1: lpcjax faster)"})


if __name__ == "__main__":
  main()

"""fla's FoX decoding: tokens per second of one-token steps with its cache, the peer of decode.py.

fla's ``ForgettingTransformerForCausalLM`` (flash-linear-attention) at the size of lpcjax's
FoX (Pro) 125M (``paper:fox_pro_125m``: 12 layers, d 768, 12 heads, GPT-2 vocabulary), with
fla's own Pro parts (QK-norm, output gate; fla has no token shift or output norm), random
weights, in eager PyTorch as fla's ``generate`` runs it: a prefill of the prompt (the last
position's logits only; timed the second time, after its kernels compiled), then greedy
one-token steps with the key/value cache; time of --new-tokens steps after two warm-up steps
(CUDA synchronised), tokens/s counting every row.

  python benchmarks/decode_peers.py --prompt-lens 4096 32768 --batch-sizes 1 16 --new-tokens 64
  python benchmarks/decode_peers.py --interpret --dtype float16 --hidden-size 64 --layers 2 \\
      --heads 4 --prompt-lens 40 --new-tokens 2              # a CPU rehearsal (attention_peers.py)
"""

import argparse
import itertools
import os
import platform
import time

from attention_peers import interpreter_stand_ins

from lpcjax.files import write_json_atomic


def parse_args():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--prompt-lens", type=int, nargs="+", default=[4096, 32768])
  parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
  parser.add_argument("--new-tokens", type=int, default=64)
  parser.add_argument("--hidden-size", type=int, default=768)
  parser.add_argument("--layers", type=int, default=12)
  parser.add_argument("--heads", type=int, default=12)
  parser.add_argument("--vocab-size", type=int, default=50257)
  parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
  parser.add_argument("--interpret", action="store_true", help="CPU rehearsal in Triton's interpreter")
  parser.add_argument("--out", default=None)
  return parser.parse_args()


def main():
  args = parse_args()
  if args.interpret:
    os.environ["TRITON_INTERPRET"] = "1"
  import torch
  if args.interpret:
    interpreter_stand_ins(torch)
  from fla.models import ForgettingTransformerConfig, ForgettingTransformerForCausalLM

  device = "cuda" if torch.cuda.is_available() and not args.interpret else "cpu"
  config = ForgettingTransformerConfig(
      vocab_size=args.vocab_size, hidden_size=args.hidden_size, num_hidden_layers=args.layers,
      num_heads=args.heads, qk_norm=True, use_output_gate=True, tie_word_embeddings=True,
      intermediate_size=int(args.hidden_size * 3.5) // 64 * 64 or 64, fuse_cross_entropy=False)
  torch.manual_seed(0)
  model = ForgettingTransformerForCausalLM(config).to(device=device, dtype=getattr(torch, args.dtype)).eval()
  sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
  import fla
  out = args.out or os.path.join(os.path.dirname(__file__), "results", f"decode_peers_{device}.json")
  result = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "interpreted": args.interpret,
            "torch": torch.__version__, "fla": fla.__version__, "python": platform.python_version(),
            "model": config.to_dict(), "params": sum(p.numel() for p in model.parameters()), "rows": []}
  print(f"fla {fla.__version__} FoX, {result['params'] / 1e6:.1f}M parameters, {device}, {args.dtype}")
  print(f"{'batch':>5} {'prompt':>7} {'prefill s':>10} {'tok/s':>10}")
  for batch, prompt_len in itertools.product(args.batch_sizes, args.prompt_lens):
    row = {"batch": batch, "prompt_len": prompt_len, "new_tokens": args.new_tokens}
    try:
      with torch.no_grad():
        tokens = torch.randint(0, args.vocab_size, (batch, prompt_len), device=device)
        mask = torch.ones_like(tokens)
        prefill = lambda: model(input_ids=tokens, attention_mask=mask, use_cache=True, logits_to_keep=1)
        prefill()  # the prompt's kernels compile (and autotune) at this length first
        sync()
        start = time.perf_counter()
        step = prefill()
        sync()
        row["prefill_s"] = time.perf_counter() - start

        def decode(steps, step):
          nonlocal mask
          for _ in range(steps):
            token = step.logits[:, -1].argmax(-1, keepdim=True)
            mask = torch.cat([mask, torch.ones_like(token)], dim=1)
            step = model(input_ids=token, attention_mask=mask, past_key_values=step.past_key_values,
                         use_cache=True)
          return step
        step = decode(2, step)  # warm-up: the one-token kernels compile
        sync()
        start = time.perf_counter()
        decode(args.new_tokens, step)
        sync()
        row["tokens_per_s"] = batch * args.new_tokens / (time.perf_counter() - start)
      print(f"{batch:>5} {prompt_len:>7} {row['prefill_s']:>10.2f} {row['tokens_per_s']:>10.1f}", flush=True)
    except Exception as error:  # a size that does not run is reported, not fatal
      row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
      print(f"{batch:>5} {prompt_len:>7}   {row['error']}", flush=True)
    finally:
      if device == "cuda":
        torch.cuda.empty_cache()
    result["rows"].append(row)
    write_json_atomic(out, result)
  print(f"wrote {out}")


if __name__ == "__main__":
  main()

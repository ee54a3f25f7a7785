"""python -m lpcjax.convert: PyTorch FoX checkpoints (Hugging Face format) <-> lpcjax runs.

  python -m lpcjax.convert fox-pro-760m runs/fox-pro-760m            # import (format from config.json)
  python -m lpcjax.convert --to-hf runs/fox-pro-760m exported/       # export for the official package
  python -m lpcjax.convert --to-hf runs/mine exported/ --format fla   # ... for flash-linear-attention

Errors (an option lpcjax does not have, a missing tensor, an existing OUT) are one line on
stderr and exit status 2; nothing is written.
"""

import argparse
import sys

from lpcjax import cli
from lpcjax.convert import PAPER_CONTEXT


def parse_args(argv):
  parser = argparse.ArgumentParser(prog="python -m lpcjax.convert", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("src", metavar="SRC", help="a Hugging Face model directory (with --to-hf: an lpcjax run)")
  parser.add_argument("out", metavar="OUT", help="the directory to write (must not exist unless --force)")
  parser.add_argument("--to-hf", action="store_true", help="export the lpcjax run SRC as a Hugging Face directory")
  parser.add_argument("--format", default="official", choices=("official", "fla"),
                      help="--to-hf: the PyTorch package to write for (default: official)")
  parser.add_argument("--step", type=int, default=None, help="--to-hf: checkpoint step (default: the latest)")
  parser.add_argument("--seq-len", type=int, default=PAPER_CONTEXT,
                      help=f"import: the run's data.seq_len (default {PAPER_CONTEXT}, the FoX paper's context)")
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                      help="import: the model's compute dtype (params stay float32)")
  parser.add_argument("--tokenizer-file", default=None,
                      help="import: the tiktoken rank file of the model's GPT-2 tokenizer, "
                           "recorded in the run so that eval.py and generate find it offline")
  parser.add_argument("--force", action="store_true", help="replace an existing OUT written by this tool")
  return parser.parse_args(argv)


def main(argv=None):
  args = parse_args(argv)
  from lpcjax.convert import export_run, import_checkpoint

  def convert():
    if args.to_hf:
      hf = export_run(args.src, args.out, fmt=args.format, step=args.step, force=args.force)
      print(f"wrote {args.out} ({hf['model_type']}, {args.format} format)")
    else:
      config = import_checkpoint(args.src, args.out, seq_len=args.seq_len, dtype=args.dtype,
                                 force=args.force, tokenizer_file=args.tokenizer_file)
      print(f"wrote {args.out} ({config.model.family}, {config.model.describe()}); "
            f"evaluate with: python eval.py --run {args.out} --tokens PREFIX")
    return 0

  return cli.exit_status(convert)


if __name__ == "__main__":
  sys.exit(main())

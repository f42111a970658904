"""Export a trained run's EMA network as a teacher checkpoint - now ``fastgen convert-ckpt --only``; this shim
keeps the old command line working.

    fastgen convert-ckpt RUN/checkpoints/0004000.pth teacher.pth --only ema
    python scripts/export_teacher.py RUN/checkpoints/0004000.pth --out teacher.pth [--module ema]   # the same

The output is a fastgen checkpoint holding one network, ``net`` (the chosen network's weights), plus a note of
where it came from; ``model.teacher_ckpt`` and ``trainer.checkpointer.pretrained_ckpt_path`` load it. As
``convert-ckpt`` never overwrites, ``--out`` must not exist.
"""

from __future__ import annotations

import argparse
import sys

from fastgen.cli.main import main as fastgen_main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("--out", default="fastgen/assets/digits_teacher.pth")
    parser.add_argument("--module", default="ema")
    args = parser.parse_args()
    fastgen_main(["convert-ckpt", args.checkpoint, args.out, "--only", args.module, "--to", "pth"])


if __name__ == "__main__":
    sys.exit(main())

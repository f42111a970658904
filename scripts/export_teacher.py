"""Export a trained run's EMA network as a compact teacher checkpoint (what ships as
``fastgen/assets/digits_teacher.pth``).

    python scripts/export_teacher.py RUN/checkpoints/0004000.pth [--out fastgen/assets/digits_teacher.pth] [--module ema]

The output is a fastgen checkpoint holding one module, ``net`` (the chosen module's weights), plus a note of where
it came from; distillation recipes load it with ``model.teacher_ckpt``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from fastgen.utils.checkpointer import FORMAT, load_checkpoint
from fastgen.utils.io import atomic_write_with


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("--out", default="fastgen/assets/digits_teacher.pth")
    parser.add_argument("--module", default="ema")
    args = parser.parse_args()
    payload = load_checkpoint(args.checkpoint)
    if args.module not in payload["model"]:
        raise SystemExit(f"{args.checkpoint} has no module {args.module!r} (it has {', '.join(payload['model'])})")
    state = {k: v.detach().clone().contiguous() for k, v in payload["model"][args.module].items()}
    teacher = {"format": FORMAT, "version": 1, "iteration": int(payload["iteration"]), "model": {"net": state},
               "source": f"{Path(args.checkpoint).name}:{args.module} (iteration {int(payload['iteration'])})"}
    atomic_write_with(Path(args.out), lambda f: torch.save(teacher, f))
    print(f"wrote {args.out}: {sum(v.numel() for v in state.values())} parameters from {args.module} at iteration {payload['iteration']}")


if __name__ == "__main__":
    main()

"""Moving digits: does a video family learn on a CPU? Scores a ``Digits/config_sft_wan_moving_digits`` run's EMA
network against the same network at initialisation (``fastgen.evaluation.moving_digits``: per-frame digits FD,
accuracy averaged over frames, temporal consistency), and real videos for the floor.

    .venv/bin/python benchmarks/moving_digits.py                          # train (2,000 iterations) and score
    .venv/bin/python benchmarks/moving_digits.py --run RUN_DIR --samples 2000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quality import train  # noqa: E402


def sample_scores(model, net, n: int, steps: int) -> dict:  # noqa: ANN001
    import torch

    from fastgen.evaluation.moving_digits import score_videos

    videos, labels = [], []
    generator = torch.Generator().manual_seed(0)
    for start in range(0, n, 250):
        batch, label = model.sample(min(250, n - start), generator=generator, net=net, steps=steps)
        videos.append(batch.clamp(-1, 1))
        labels.append(label)
    return score_videos(torch.cat(videos), torch.cat(labels).numpy())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="score this run directory instead of training one")
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=25, help="Heun steps")
    parser.add_argument("extra", nargs="*", help="key=value overrides for the recipe (after --)")
    args = parser.parse_args()
    import torch

    from fastgen.checkpoint.run import load_run
    from fastgen.configs.instantiate import instantiate
    from fastgen.datasets.moving_digits import MovingDigitsDataset
    from fastgen.evaluation.moving_digits import score_videos

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = args.run
        if run_dir is None:
            run_dir, _ = train("sft_wan_moving", Path(tmp), args.extra)
        run = load_run(run_dir)
        torch.manual_seed(run.config.trainer.seed)
        initial = instantiate(run.config.model_class, config=run.config.model)  # the run's initialisation
        rows = [("initialisation", sample_scores(initial, initial.net, args.samples, args.steps)),
                (f"trained, EMA (iteration {run.iteration})",
                 sample_scores(run.model, run.model.sampling_net(), args.samples, args.steps))]
    data = MovingDigitsDataset("train")
    real = data.get_batch(torch.randperm(len(data), generator=torch.Generator().manual_seed(0))[:args.samples])
    rows.append(("real videos (train split)", score_videos(real["real"], real["condition"].numpy())))
    print(f"| network | FD per frame | accuracy | temporal consistency |  ({args.samples} videos, {args.steps} Heun steps)")
    print("|---|---:|---:|---:|")
    for name, m in rows:
        print(f"| {name} | {m['fd_per_frame']:.2f} | {m['accuracy']:.3f} | {m['temporal_consistency']:.3f} |")


if __name__ == "__main__":
    main()

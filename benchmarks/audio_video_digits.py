"""Audio-visual digits: does LTX-2's two-stream path learn on a CPU? Trains ``LTX2/config_sft_ltx2_av_digits`` (a
tiny ``LTX2VideoTransformer3DModel``, video and sound denoised together) and scores its EMA network against the same
network at initialisation and against real pairs (``fastgen.evaluation.audio_video_digits``: the video's FD per
frame and accuracy, the sound's spectral FD and pitch accuracy, and the A/V sync of loudness and position).

    .venv/bin/python benchmarks/audio_video_digits.py --iters 1500          # train, then score
    .venv/bin/python benchmarks/audio_video_digits.py --run RUN_DIR --samples 1000
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

KEYS = ("fd_per_frame", "accuracy", "spectral_fd", "pitch_accuracy", "av_sync")


def scores(model, net, n: int, steps: int | None) -> dict:  # noqa: ANN001
    import torch

    from fastgen.evaluation.audio_video_digits import score_audio_video

    generator = torch.Generator().manual_seed(0)
    videos, sounds, labels = [], [], []
    for start in range(0, n, 250):
        batch, label = model.sample(min(250, n - start), generator=generator, net=net, steps=steps)
        videos.append(batch["video"].clamp(-1, 1))
        sounds.append(batch["audio"].clamp(-1, 1))
        labels.append(label)
    return score_audio_video(torch.cat(videos), torch.cat(sounds), torch.cat(labels).numpy())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="score this run directory instead of training one")
    parser.add_argument("--iters", type=int, default=1500)
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--steps", type=int, default=None, help="sampling steps (default: the recipe's)")
    args = parser.parse_args()
    import torch

    from fastgen.checkpoint.run import load_run
    from fastgen.configs.config_utils import load_config
    from fastgen.configs.instantiate import instantiate
    from fastgen.datasets.audio_video_digits import AudioVideoDigitsDataset
    from fastgen.evaluation.audio_video_digits import score_audio_video
    from fastgen.trainer import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = args.run
        if run_dir is None:
            os.environ.setdefault("WANDB_MODE", "disabled")
            os.environ["FASTGEN_OUTPUT_ROOT"] = tmp
            config = load_config("LTX2/config_sft_ltx2_av_digits")
            config.trainer.max_iter = args.iters
            config.trainer.save_ckpt_iter = args.iters
            trainer = Trainer(config)
            trainer.run()
            run_dir = trainer.run_dir
        run = load_run(run_dir)
        torch.manual_seed(run.config.trainer.seed)
        initial = instantiate(run.config.model_class, config=run.config.model)  # the run's initialisation
        rows = [("initialisation", scores(initial, initial.net, args.samples, args.steps)),
                (f"trained, EMA (iteration {run.iteration})",
                 scores(run.model, run.model.sampling_net(), args.samples, args.steps))]
    data = AudioVideoDigitsDataset("train")
    real = data.get_batch(torch.randperm(len(data), generator=torch.Generator().manual_seed(0))[:args.samples])
    rows.append(("real pairs (train split)", score_audio_video(real["real"]["video"], real["real"]["audio"],
                                                               real["condition"].numpy())))
    print(f"| network | {' | '.join(KEYS)} |  ({args.samples} samples)")
    print("|---|" + "---:|" * len(KEYS))
    for name, m in rows:
        print(f"| {name} | " + " | ".join(f"{m[k]:.3f}" for k in KEYS) + " |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

"""Video to world on a CPU: does a video-to-world model learn to continue what it is given? Scores a
``Digits/config_sft_cosmos_predict2_v2w_moving_digits`` run (its EMA network; the first frame of each video given
clean) against the same network at initialisation, on held-out moving-digits videos: each video's first frame is
given and the 7 frames after it are sampled (25 steps of the model's ODE), with the video's label and without it
(the null condition: the digit can only come from the given frame). A control samples without the label and
without a given frame (text to world, nothing to continue), and real videos give the floor.

Scores (``fastgen.evaluation.moving_digits``): FD per frame and temporal consistency of the whole video, and the
accuracy of the *generated* frames against the label of the video whose first frame was given.

    .venv/bin/python benchmarks/video_to_world_digits.py                      # train (2,000 iterations) and score
    .venv/bin/python benchmarks/video_to_world_digits.py --run RUN_DIR --samples 500
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quality import train  # noqa: E402


def continuations(model, net, real, labels, steps: int, given: int, with_label: bool):  # noqa: ANN001, ANN201
    """``real``'s first ``given`` frames continued by ``net`` (its ODE over ``steps`` steps), conditioned on the
    labels or on the null condition."""
    import torch

    from fastgen.networks.conditioning_frames import WithConditioningFrames, with_given_frames
    from fastgen.pipelines.prompts import ode_sample
    from fastgen.pipelines.schedulers import plan_of

    schedule = net.noise_scheduler
    plan = plan_of(model, "net", steps, 1.0)
    sigma_max = float(schedule.sigma(torch.tensor(float(schedule.t_max), dtype=torch.float64)))
    out = []
    generator = torch.Generator().manual_seed(0)
    for start in range(0, real.shape[0], 250):
        clean = real[start:start + 250]
        noise = torch.randn(clean.shape, generator=generator) * sigma_max
        hot = torch.nn.functional.one_hot(labels[start:start + 250], 10).float()
        condition = hot if with_label else torch.zeros_like(hot)
        sampler = WithConditioningFrames(net, given, clean=clean) if given else net
        x = with_given_frames(noise, clean, given)
        with torch.no_grad():
            out.append(ode_sample(sampler, x, condition, None, plan).clamp(-1, 1))
    return torch.cat(out)


def scores(videos, labels) -> dict:  # noqa: ANN001
    """``score_videos``' whole-video scores and the accuracy of frames 1.. (the generated ones)."""
    from fastgen.evaluation.digits import classifier_outputs
    from fastgen.evaluation.moving_digits import crop_digits, score_videos

    result = score_videos(videos, labels.numpy())
    n, _, frames = videos.shape[:3]
    _, preds = classifier_outputs(crop_digits(videos[:, :, 1:]).reshape(-1, 1, 8, 8))
    result["generated_accuracy"] = float((preds.reshape(n, frames - 1) == labels.numpy()[:, None]).mean())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="score this run directory instead of training one")
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("extra", nargs="*", help="key=value overrides for the recipe (after --)")
    args = parser.parse_args()
    import torch

    from fastgen.checkpoint.run import load_run
    from fastgen.configs.instantiate import instantiate
    from fastgen.datasets.moving_digits import MovingDigitsDataset

    data = MovingDigitsDataset("val")
    batch = data.get_batch(torch.randperm(len(data), generator=torch.Generator().manual_seed(0))[:args.samples])
    real, labels = batch["real"], batch["condition"]
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = args.run
        if run_dir is None:
            run_dir, _ = train("sft_cosmos_predict2_v2w_moving", Path(tmp), args.extra)
        run = load_run(run_dir)
        torch.manual_seed(run.config.trainer.seed)
        initial = instantiate(run.config.model_class, config=run.config.model)  # the run's initialisation
        trained, net = run.model, run.model.sampling_net()
        rows = [
            ("initialisation, first frame given, label", scores(
                continuations(initial, initial.net, real, labels, args.steps, 1, True), labels)),
            (f"trained (EMA, iteration {run.iteration}), first frame given, label", scores(
                continuations(trained, net, real, labels, args.steps, 1, True), labels)),
            ("trained, first frame given, no label", scores(
                continuations(trained, net, real, labels, args.steps, 1, False), labels)),
            ("trained, nothing given, no label (control)", scores(
                continuations(trained, net, real, labels, args.steps, 0, False), labels)),
        ]
    rows.append(("real videos (val split)", scores(real, labels)))
    print(f"| network | FD per frame | accuracy of generated frames | temporal consistency |  ({args.samples} "
          f"held-out videos, {args.steps} steps)")
    print("|---|---:|---:|---:|")
    for name, m in rows:
        print(f"| {name} | {m['fd_per_frame']:.1f} | {m['generated_accuracy']:.3f} | {m['temporal_consistency']:.3f} |")


if __name__ == "__main__":
    main()

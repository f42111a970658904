"""Digits text to image, judged by diffusers itself: the exported few-step student and the shipped teacher, each
run as a ``DiffusionPipeline`` on prompts "a handwritten zero" ... "nine", scored by the shipped digits classifier.

    .venv/bin/python benchmarks/digits_t2i.py STUDENT_FOLDER [--teacher fastgen/assets/digits_t2i] [-n 100]
        [--grid docs/digits_t2i_grid.png] [--json PATH]

STUDENT_FOLDER is ``fastgen convert-ckpt RUN OUT --to diffusers``'s output; its ``fastgen_export.json`` gives the
call arguments (the teacher's too). For each digit, ``-n`` samples (seeds 0..n-1, one generator each) of each
pipeline; the 8x8 RGB outputs become grey (the channel mean) and go through ``fastgen.evaluation.digits``:

* **accuracy** - the classifier's agreement with the digit the prompt names (goal for the student: >= 0.9);
* **fd_digits** - the Fréchet distance in its features to all real digits; and **fd_to_teacher** - between the
  student's and the teacher's samples;
* a grid: one column per digit, the student's first 10 samples.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def render(folder: Path, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(10 n, 8, 8)`` uint8 grey samples of the pipeline in ``folder`` and their digits."""
    from diffusers import DiffusionPipeline

    call = json.loads((folder / "fastgen_export.json").read_text())["call"]
    pipe = DiffusionPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    images, labels = [], []
    for digit, word in enumerate(WORDS):
        prompts = [f"a handwritten {word}"] * n
        out = pipe(prompts, generator=[torch.Generator().manual_seed(s) for s in range(n)], height=8, width=8,
                   output_type="np", **call).images
        images.append((out.mean(-1) * 255).round().astype(np.uint8))
        labels += [digit] * n
    return np.concatenate(images), np.array(labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("student", type=Path)
    parser.add_argument("--teacher", type=Path, default=Path(__file__).resolve().parents[1] / "fastgen/assets/digits_t2i")
    parser.add_argument("-n", type=int, default=100)
    parser.add_argument("--grid", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from fastgen.evaluation.digits import classifier_accuracy, classifier_outputs, frechet_distance_digits
    from fastgen.evaluation.frechet import frechet_distance_features

    results = {}
    samples = {}
    for name, folder in (("student", args.student), ("teacher", args.teacher)):
        images, labels = render(folder, args.n)
        samples[name] = images
        results[name] = {"accuracy": classifier_accuracy(images, labels),
                         "fd_digits": frechet_distance_digits(images)["fd_digits"],
                         "steps": len(json.loads((folder / "fastgen_export.json").read_text())["times"])}
        print(name, json.dumps(results[name]), flush=True)
    features = {name: classifier_outputs(images)[0] for name, images in samples.items()}
    results["fd_student_to_teacher"] = frechet_distance_features(features["student"], features["teacher"])
    print("fd student -> teacher", round(results["fd_student_to_teacher"], 4))
    if args.grid is not None:
        from PIL import Image

        rows = [np.concatenate([samples["student"][d * args.n + r] for d in range(10)], axis=1) for r in range(min(10, args.n))]
        grid = np.kron(np.concatenate(rows, axis=0), np.ones((4, 4), np.uint8))  # 4x: 8x8 digits are tiny
        Image.fromarray(grid).save(args.grid)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()

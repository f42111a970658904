"""PDD on digits: one trained student (``Digits/config_pdd_digits``) scored at 1, 2, 4 and 8 evaluations.

Trains the recipe (or takes ``--run RUN_DIR``), then draws 5,000 samples of the EMA student for each block count
(``even_blocks``: 8 intervals in 1, 2, 4 or 8 fused blocks) and scores them with the shipped digits classifier
(FD in its feature space, accuracy on the conditioning label); network evaluations are counted with a forward
hook. The teacher's 18-step Heun row (35 evaluations) is the reference of the recipe bar (accuracy >= 0.95 and FD
<= 3x the teacher's at 4 evaluations).

    .venv/bin/python benchmarks/pdd_digits.py                 # train (~4 min on 2 CPU cores) and score (~2 min)
    .venv/bin/python benchmarks/pdd_digits.py --run RUN_DIR   # score an existing run
    .venv/bin/python benchmarks/pdd_digits.py -- model.teacher_integrator=euler   # a variant of the recipe
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quality import count_evaluations, train  # noqa: E402

STEPS = [1, 2, 4, 8]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="score this run directory instead of training one")
    parser.add_argument("--samples", type=int, default=5000)
    parser.add_argument("extra", nargs="*", help="key=value overrides for the recipe (after --)")
    args = parser.parse_args()
    from fastgen.evaluation.evaluate import evaluate_model
    from fastgen.evaluation.sampling import load_run

    wall = None
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = args.run
        if run_dir is None:
            run_dir, wall = train("pdd", Path(tmp), args.extra)
        model = load_run(run_dir).model
        model.init_frozen_weights()  # the teacher is not in checkpoints: rebuilt from model.teacher_ckpt
        net = model.sampling_net()
        rows = []
        teacher = evaluate_model(model, args.samples, seed=0, steps=model.config.sample_steps, net=model.teacher,
                                 dataset="digits")
        rows.append(("teacher (Heun, 18 steps)", 35, teacher))
        for steps in STEPS:
            metrics = evaluate_model(model, args.samples, seed=0, steps=steps, net=net, dataset="digits")
            rows.append((f"PDD student, {steps} block(s)", count_evaluations_at(model, net, steps), metrics))
    bar = 3 * teacher["fd_digits"]
    print(f"| sampler | network evaluations | FD (digits) | accuracy |  (bar at 4: FD <= {bar:.2f}, accuracy >= 0.95)")
    print("|---|---:|---:|---:|")
    for name, evaluations, metrics in rows:
        print(f"| {name} | {evaluations} | {metrics['fd_digits']:.3f} | {metrics['accuracy']:.3f} |")
    if wall is not None:
        print(f"\ntraining wall time: {wall:.0f} s")


def count_evaluations_at(model, net, steps: int) -> int:  # noqa: ANN001
    """Evaluations per sample of ``steps`` blocks (``count_evaluations`` with ``model.inference_blocks`` set)."""
    from fastgen.methods.pdd import even_blocks

    model.config.inference_blocks = even_blocks(int(model.config.grid_size), steps)
    try:
        return count_evaluations(model, net)
    finally:
        model.config.inference_blocks = None


if __name__ == "__main__":
    main()

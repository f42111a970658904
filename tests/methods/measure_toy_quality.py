"""Measure what the toy quality tests assert, over several seeds: the data's own energy-distance floor, the SFT
teacher's multi-step energy distance, and every toy student's 1-step (or few-step) energy distance before and
after training, with the same configs the tests use (``tests/methods/test_*.py``).

    OMP_NUM_THREADS=1 python tests/methods/measure_toy_quality.py --seeds 0 1 2 [--only cm_ct kd_1step ...]

Seed ``s`` trains the teacher with ``trainer.seed = s`` and each student with ``trainer.seed = s`` from that
teacher (the tests use seed 0). Prints one line per run and a table of ratios (student / teacher, teacher /
floor) at the end; ``--json PATH`` writes every number.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def students(teacher: Path, seed: int, scratch: Path) -> dict[str, Callable[[], Any]]:
    """name -> a function that runs the student and returns ``(before, after, extra)``."""
    from test_adversarial_e2e import ADVERSARIAL_RECIPES, adversarial_config
    from test_cm import cm_config
    from test_kd import TWO_STEP, kd_config
    from test_meanflow import meanflow_config
    from test_scm import scm_config
    from test_tcm import tcm_config
    from toy_distill import build, toy_energy, train

    from fastgen.configs.instantiate import instantiate

    def simple(make: Callable[[], Any], ema: bool = False) -> Callable[[], Any]:
        def run() -> Any:
            config = make()
            before = toy_energy(build(config))
            model = train(config)
            return before, toy_energy(model, net=model.ema_nets["ema"] if ema else None), {}
        return run

    def adversarial(recipe: str) -> Callable[[], Any]:
        def run() -> Any:
            config = adversarial_config(recipe, teacher, seed)
            initial = instantiate(config.model_class, config=config.model)
            initial.init_weights()
            return toy_energy(initial), toy_energy(train(config)), {}
        return run

    def tcm() -> Any:
        from fastgen.trainer import Trainer

        first = tcm_config(1, teacher, seed=seed)
        before = toy_energy(build(first))
        trainer = Trainer(first)
        stage1 = toy_energy(trainer.run())
        after = toy_energy(train(tcm_config(2, teacher, str(trainer.last_checkpoint), seed=seed)))
        return before, after, {"stage1": stage1, "stage2_over_stage1": after / stage1}

    runs: dict[str, Callable[[], Any]] = {
        recipe.split("config_")[1].removesuffix("_toy"): adversarial(recipe) for recipe in ADVERSARIAL_RECIPES
    }
    runs.update({
        "cm_ct": simple(lambda: cm_config("ct", teacher, seed)),
        "cm_cd": simple(lambda: cm_config("cd", teacher, seed)),
        "kd_1step": simple(lambda: kd_config(None, teacher, scratch / "pairs_1.pt", seed)),
        "kd_2step": simple(lambda: kd_config(TWO_STEP, teacher, scratch / "pairs_2.pt", seed)),
        "meanflow": simple(lambda: meanflow_config(seed), ema=True),
        "scm": simple(lambda: scm_config(teacher, seed)),
        "tcm": tcm,
    })
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--only", nargs="*", default=None, help="student names to run (default: all)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    import torch

    from toy_distill import data_floor, teacher_energy, train_teacher

    torch.set_num_threads(1)
    os.environ["WANDB_MODE"] = "disabled"
    os.environ["FASTGEN_NO_PROGRESS"] = "1"
    results: dict[str, Any] = {"floor": data_floor(), "seeds": {}}
    print(f"data floor (energy distance of fresh data, n=2000): {results['floor']:.5f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            start = time.perf_counter()
            teacher = Path(train_teacher(Path(tmp) / f"teacher_{seed}", seed))
            record: dict[str, Any] = {"teacher": teacher_energy(teacher), "students": {}}
            print(f"seed {seed}: teacher {record['teacher']:.5f} ({record['teacher'] / results['floor']:.2f}x floor, "
                  f"{time.perf_counter() - start:.0f} s)", flush=True)
            for name, run in students(teacher, seed, Path(tmp) / f"scratch_{seed}").items():
                if args.only and name not in args.only:
                    continue
                os.environ["FASTGEN_OUTPUT_ROOT"] = str(Path(tmp) / f"out_{seed}_{name}")  # no run resumes another
                (Path(tmp) / f"scratch_{seed}").mkdir(exist_ok=True)
                start = time.perf_counter()
                before, after, extra = run()
                record["students"][name] = {"before": before, "after": after,
                                            "after_over_teacher": after / record["teacher"], **extra}
                print(f"seed {seed}: {name:10s} {before:.4f} -> {after:.5f}  ({after / record['teacher']:.2f}x teacher"
                      + "".join(f", {k} {v:.4f}" for k, v in extra.items())
                      + f", {time.perf_counter() - start:.0f} s)", flush=True)
            results["seeds"][seed] = record
    names = sorted({n for r in results["seeds"].values() for n in r["students"]})
    print("\nstudent / teacher energy distance, by seed")
    for name in names:
        ratios = [f"{r['students'][name]['after_over_teacher']:.2f}" for r in results["seeds"].values() if name in r["students"]]
        print(f"  {name:10s} {'  '.join(ratios)}")
    print("  teacher / floor: " + "  ".join(f"{r['teacher'] / results['floor']:.2f}" for r in results["seeds"].values()))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

"""``fastgen train --eval-samples N`` on a distillation recipe: the student's and the teacher's scores side by side
in stdout and ``evaluation.json``; the teacher's are computed on the first run, written to the user's cache folder
(``$XDG_CACHE_HOME/fastgen``; nothing beside the teacher's checkpoint) and read back (marked "cached") by the next
run with the same teacher and settings."""

from __future__ import annotations

import json
import os
from pathlib import Path

from fastgen_testing import run_cli

QUIET = ["log_config.wandb_mode=disabled", "trainer.logging_iter=2"]


def test_eval_samples_scores_student_and_teacher_and_caches_the_teacher(output_root: Path, tmp_path: Path) -> None:
    teacher_run = run_cli("train", "--config", "Toy/config_sft_toy", "-", "trainer.max_iter=2",
                          "trainer.save_ckpt_iter=2", "log_config.name=eval_teacher", *QUIET, cwd=tmp_path)
    assert teacher_run.returncode == 0, teacher_run.stderr[-2000:]
    teacher_ckpt = output_root / "fastgen" / "toy" / "eval_teacher" / "checkpoints" / "0000002.pth"
    assert teacher_ckpt.is_file()
    beside_teacher = sorted(teacher_ckpt.parent.iterdir())
    cache_home = Path(os.environ["XDG_CACHE_HOME"])  # the test's own (conftest), inherited by the commands

    def distill(name: str):  # noqa: ANN202 - a CompletedProcess and the evaluation record
        result = run_cli("train", "--config", "Toy/config_dmd2_toy", "--eval-samples", "300", "-",
                         "trainer.max_iter=2", "trainer.save_ckpt_iter=2", f"log_config.name={name}",
                         f"model.teacher_ckpt={teacher_ckpt}", "model.sample_steps=3", *QUIET, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-2000:]
        record = json.loads((output_root / "fastgen" / "toy" / name / "evaluation.json").read_text())
        return result, record

    first, first_record = distill("eval_student_1")
    assert "teacher (5 evaluations)" in first.stdout and "energy_distance" in first.stdout
    assert first_record["num_samples"] == 300 and first_record["teacher_scores_cached"] is False
    assert set(first_record["results"]) == {"student", "teacher"}
    (cache,) = (cache_home / "fastgen" / "teacher_eval").glob("0000002-*.eval.json")
    assert sorted(teacher_ckpt.parent.iterdir()) == beside_teacher  # nothing written beside the teacher

    second, second_record = distill("eval_student_2")
    assert "teacher (5 evaluations, cached)" in second.stdout and str(cache) in second.stdout.replace("\n", "")
    assert second_record["teacher_scores_cached"] is True
    assert second_record["results"]["teacher"] == first_record["results"]["teacher"]

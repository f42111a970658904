"""A small toy diffusion teacher, trained once per test session with the real Trainer (SFT, EDM, eight
Gaussians), for the distillation tests, and its multi-step quality that the students are compared with."""

from __future__ import annotations

from pathlib import Path

import pytest

from toy_distill import teacher_energy, train_teacher


@pytest.fixture(scope="session")
def toy_teacher_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The final checkpoint of a toy SFT run (the teacher of the distillation tests)."""
    return Path(train_teacher(tmp_path_factory.mktemp("toy_teacher")))


@pytest.fixture(scope="session")
def toy_teacher_energy(toy_teacher_ckpt: Path) -> float:
    """The teacher's energy distance to fresh data with 18 Heun steps (``toy_distill.teacher_energy``)."""
    return teacher_energy(toy_teacher_ckpt)

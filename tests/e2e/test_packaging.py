"""Installed, only ``fastgen`` lands at the top of site-packages: ``cli/`` and ``templates/`` ship inside it."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_holds_only_the_fastgen_package(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--disable-pip-version-check", "-w", str(tmp_path), str(REPO)],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    wheel = next(tmp_path.glob("fastgen-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names}
    assert top_level == {"fastgen", next(n for n in top_level if n.endswith(".dist-info"))}
    for expected in ("fastgen/cli/main.py", "fastgen/templates/experiment.py.tmpl",
                     "fastgen/templates/callback.py.tmpl", "fastgen/templates/env.example",
                     "fastgen/configs/experiments/Digits/config_sft_digits.py"):
        assert expected in names, expected
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "fastgen = fastgen.cli.main:main" in entry_points

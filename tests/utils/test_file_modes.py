"""Files fastgen writes atomically get the mode ``open(path, "w")`` would give them (``0o666 & ~umask``), not the
0600 of ``tempfile.mkstemp``: on a shared disk, teammates whose umask lets them read a colleague's files can read
that colleague's checkpoints, ``config.yaml`` and sample grids too."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastgen_testing import FASTGEN

from fastgen.checkpoint.convert import staged_file
from fastgen.utils import io as fastgen_io
from fastgen.utils.io import atomic_open, atomic_write_text, atomic_write_with, current_umask, new_file_mode


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask() -> Iterator[Callable[[int], None]]:
    """Set this process's umask for the test (restored after it)."""
    original = os.umask(0o022)
    os.umask(original)
    try:
        yield os.umask
    finally:
        os.umask(original)


@pytest.mark.parametrize(("mask", "expected"), [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600), (0o002, 0o664)])
def test_atomic_writes_get_the_mode_of_an_ordinary_new_file(tmp_path: Path, umask: Callable[[int], None], mask: int,
                                                             expected: int) -> None:
    umask(mask)
    atomic_write_text(tmp_path / "config.yaml", "a: 1\n")
    atomic_write_with(tmp_path / "ckpt.pth", lambda handle: handle.write(b"weights"))
    with atomic_open(tmp_path / "nested" / "grid.png", "wb") as handle:
        handle.write(b"png")
    with open(tmp_path / "plain.txt", "w") as handle:  # what the atomic writes must match
        handle.write("x")
    assert mode_of(tmp_path / "plain.txt") == expected
    for path in (tmp_path / "config.yaml", tmp_path / "ckpt.pth", tmp_path / "nested" / "grid.png"):
        assert mode_of(path) == expected, (path.name, oct(mode_of(path)))
    assert (tmp_path / "config.yaml").read_text() == "a: 1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pth", "config.yaml", "nested", "plain.txt"]


def test_replacing_a_file_takes_the_current_umask(tmp_path: Path, umask: Callable[[int], None]) -> None:
    umask(0o077)
    atomic_write_text(tmp_path / "config.yaml", "old\n")
    assert mode_of(tmp_path / "config.yaml") == 0o600
    umask(0o022)
    atomic_write_text(tmp_path / "config.yaml", "new\n")
    assert mode_of(tmp_path / "config.yaml") == 0o644 and (tmp_path / "config.yaml").read_text() == "new\n"


def test_convert_ckpt_staged_files_get_the_mode_of_an_ordinary_new_file(tmp_path: Path,
                                                                       umask: Callable[[int], None]) -> None:
    """``fastgen convert-ckpt`` writes each output to a ``mkstemp`` path (writers that truncate it keep its mode)
    and renames it into place."""
    umask(0o027)
    target = tmp_path / "out" / "model.safetensors"
    with staged_file(target) as temporary:
        with open(temporary, "wb") as handle:  # as torch.save / safetensors do: truncate the existing file
            handle.write(b"tensors")
    assert target.read_bytes() == b"tensors" and mode_of(target) == 0o640


def test_the_umask_is_read_without_changing_it_and_the_fallback_agrees(umask: Callable[[int], None],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    umask(0o027)
    assert current_umask() == 0o027 and new_file_mode() == 0o640

    def no_proc(*args: object, **kwargs: object) -> None:
        raise FileNotFoundError("/proc/self/status")

    monkeypatch.setattr(fastgen_io, "open", no_proc, raising=False)  # a system without /proc: set and restore
    assert current_umask() == 0o027
    assert os.umask(0o027) == 0o027  # restored by the fallback


def test_a_short_training_run_leaves_its_files_readable_by_group_and_others(output_root: Path, tmp_path: Path) -> None:
    """End to end, under umask 022: ``config.yaml``, the checkpoint and the sample grid come out 0644."""
    result = subprocess.run(
        [FASTGEN, "train", "-c", "Toy/config_sft_toy", "-", "trainer.max_iter=2", "trainer.save_ckpt_iter=2",
         "trainer.logging_iter=1", "log_config.name=modes", "log_config.wandb_mode=disabled"],
        cwd=tmp_path, capture_output=True, text=True, timeout=240, preexec_fn=lambda: os.umask(0o022))
    assert result.returncode == 0, result.stderr[-2000:]
    run_dir = output_root / "fastgen" / "toy" / "modes"
    written = {path.relative_to(run_dir).as_posix(): mode_of(path) for path in run_dir.rglob("*") if path.is_file()}
    assert {"config.yaml", "checkpoints/0000002.pth"} <= set(written), written
    assert {name: oct(mode) for name, mode in written.items() if mode != 0o644} == {}

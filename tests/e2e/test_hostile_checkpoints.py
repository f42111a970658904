"""Hostile checkpoint files (``tests/hostile_files.py``) through every command that reads a checkpoint, locally:
``convert-ckpt``, ``sample``, ``check-ranks --checkpoint``, ``trainer.checkpointer.pretrained_ckpt_path``,
``model.teacher_ckpt`` and resume. Each is refused with one line and exit 1, the payload's sentinel file never
appears, nothing is written, and no message mentions ``weights_only``. The S3 readers get the same corpus in
``test_hostile_checkpoints_s3.py``."""

from __future__ import annotations

import shutil

import pytest
from fastgen_testing import run_cli
from hostile_files import CASES, META_CASES, Corpus, assert_refused, build_corpus, make_case

pytestmark = pytest.mark.slow

@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    return build_corpus(tmp_path_factory.mktemp("hostile"))


@pytest.mark.parametrize("case", CASES)
def test_every_local_reader_refuses_the_file(case: str, corpus: Corpus) -> None:
    folder = corpus.root / case
    checkpoint = make_case(case, folder, corpus.base_pth, corpus.base_marker, corpus.sentinel(case))
    # a run directory whose newest checkpoint is the hostile one (sample, resume)
    run_dir = corpus.output_root / "fastgen" / "toy" / f"hostile_{case}"
    (run_dir / "checkpoints").mkdir(parents=True)
    shutil.copy(corpus.base_pth.parents[1] / "config.yaml", run_dir / "config.yaml")
    for item in folder.glob("0000002.*"):
        (shutil.copytree if item.is_dir() else shutil.copy)(item, run_dir / "checkpoints" / item.name)
    fsdp = ["trainer.fsdp=True"] if case in META_CASES else []  # a sharded checkpoint is resumed by an FSDP run
    commands = {
        "convert-ckpt": ("convert-ckpt", str(checkpoint), str(folder / "converted.pth")),
        "sample": ("sample", str(run_dir), "-n", "2", "-o", str(folder / "samples.npz")),
        "check-ranks": ("check-ranks", "-c", str(run_dir / "config.yaml"), "--checkpoint", str(checkpoint)),
        "pretrained_ckpt_path": ("train", "-c", "Toy/config_sft_toy", "-", "trainer.max_iter=2",
                                 f"log_config.name=pretrained_{case}",
                                 f"trainer.checkpointer.pretrained_ckpt_path={checkpoint}"),
        "teacher_ckpt": ("train", "-c", "Toy/config_dmd2_toy", "-", "trainer.max_iter=2",
                         f"log_config.name=teacher_{case}", f"model.teacher_ckpt={checkpoint}"),
        "resume": ("train", "-c", "Toy/config_sft_toy", "-", "trainer.max_iter=4", f"log_config.name=hostile_{case}",
                   *fsdp),
    }
    for what, command in commands.items():
        assert_refused(run_cli(*command, cwd=corpus.root, env=corpus.env), case, corpus, what)
    assert not (folder / "converted.pth").exists() and not (folder / "samples.npz").exists()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == sorted(p.name for p in folder.glob("0000002.*"))
    for name in (f"pretrained_{case}", f"teacher_{case}"):  # a run that never started leaves no folder
        assert not (corpus.output_root / "fastgen" / "toy" / name).exists()

"""The hostile checkpoint corpus (``tests/hostile_files.py``) in a bucket of a real S3 server on loopback: the S3
readers - ``convert-ckpt s3://...`` (the whole-checkpoint download) and a resume from an S3 run (a monolithic run
reads the ``.pth``; an FSDP run reads ``.metadata`` through the S3 DCP reader) - refuse each with one line and exit
1, and the payload never runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastgen_testing import run_cli
from hostile_files import CASES, META_CASES, Corpus, assert_refused, build_corpus, make_case
from s3server import S3Server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    return build_corpus(tmp_path_factory.mktemp("hostile_s3"))


def upload_case(server: S3Server, folder: Path, prefix: str) -> None:
    client = server.client()
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name.startswith(("0000002", ".metadata", "__")):
            client.upload_file(str(path), server.bucket, f"{prefix}{path.relative_to(folder).as_posix()}")


@pytest.mark.parametrize("case", CASES)
def test_every_s3_reader_refuses_the_file(case: str, corpus: Corpus, s3_server: S3Server) -> None:
    folder = corpus.root / case
    make_case(case, folder, corpus.base_pth, corpus.base_marker, corpus.sentinel(case))
    credentials = s3_server.write_credentials(corpus.root / f"credentials_{case}")
    container = f"hostile/{case}"
    prefix = f"{container}/fastgen/toy/run/checkpoints/"
    upload_case(s3_server, folder, prefix)
    marker = f"s3://{s3_server.bucket}/{prefix}0000002.pth"
    fsdp = ["trainer.fsdp=True"] if case in META_CASES else []
    commands = {
        "convert-ckpt": ("convert-ckpt", marker, str(folder / "converted.pth"), "--credentials-dir", str(credentials)),
        "resume": ("train", "-c", "Toy/config_sft_toy", "-", "trainer.max_iter=4", "log_config.name=run",
                   "trainer.checkpointer.use_s3=True", f"trainer.checkpointer.s3_container={s3_server.bucket}/{container}",
                   f"credentials_dir={credentials}", *fsdp),
    }
    for what, command in commands.items():
        assert_refused(run_cli(*command, cwd=corpus.root, env=corpus.env), case, corpus, f"s3 {what}")
    assert not (folder / "converted.pth").exists()

"""``fastgen download-data`` as a user runs it, against a loopback HTTP server serving archives in the datasets' real
formats (written by the tests: ``tests/dataset_files.py``). Checksums for the test archives come from
``FASTGEN_DATA_CHECKSUMS``, the variable the command documents for mirrors that repackage and for tests."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from dataset_files import DataServer, cifar10_tarball, checksums_json, data_server, fake_imagenet, md5, mnist_files
from fastgen_testing import run_cli

from fastgen.datasets.image_zip import ImageZipDataset

REPO = Path(__file__).resolve().parents[2]
ARCHIVE = "cifar-10-binary.tar.gz"


@pytest.fixture
def server() -> Iterator[DataServer]:
    with data_server() as srv:
        yield srv


def download(*args: str, tmp_path: Path, checksums: Path | None = None) -> subprocess.CompletedProcess:
    env = {"DATA_ROOT_DIR": str(tmp_path / "default_root")}
    if checksums is not None:
        env["FASTGEN_DATA_CHECKSUMS"] = str(checksums)
    return run_cli("download-data", *args, cwd=tmp_path, env=env)


def errors(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


def serve_cifar10(server: DataServer, tmp_path: Path, body: bytes | None = None) -> tuple[bytes, dict, Path]:
    full, written = cifar10_tarball(tmp_path, per_file=3)
    served = full if body is None else body
    server.files[f"/cifar10/{ARCHIVE}"] = served
    return full, written, checksums_json(tmp_path, {ARCHIVE: full})


def test_download_verify_convert_load_and_list(server: DataServer, tmp_path: Path) -> None:
    body, written, _ = serve_cifar10(server, tmp_path)
    files, mnist = mnist_files(train=9, test=4)
    for name, data in files.items():
        server.files[f"/mnist/{name}"] = data
    checksums = checksums_json(tmp_path, {ARCHIVE: body, **files})
    out = tmp_path / "data"
    result = download("cifar10", "mnist", "--output-dir", str(out), "--mirror", server.url + "/{dataset}",
                      tmp_path=tmp_path, checksums=checksums)
    assert result.returncode == 0, result.stderr
    assert f"cifar10 ready in {out / 'cifar10'}: cifar10-32x32.zip (15 images), cifar10-32x32-test.zip (3 images)" \
        in result.stdout
    assert f"mnist ready in {out / 'mnist'}: mnist-32x32.zip (9 images), mnist-32x32-test.zip (4 images)" in result.stdout
    assert "cifar-10-binary.tar.gz" in result.stderr and "MiB/s" in result.stderr  # one line per step off a terminal
    assert files_under(out) == ["cifar10/cifar10-32x32-test.zip", "cifar10/cifar10-32x32.zip", "cifar10/manifest.json",
                                "mnist/manifest.json", "mnist/mnist-32x32-test.zip", "mnist/mnist-32x32.zip"]
    train = ImageZipDataset(str(out / "cifar10" / "cifar10-32x32.zip"))
    images, labels = written["train"]
    assert torch.equal(train.get_batch(torch.arange(15))["real"],
                       torch.from_numpy(images).permute(0, 3, 1, 2).float() / 127.5 - 1)
    assert train.get_batch(torch.arange(15))["condition"].tolist() == labels.tolist()
    assert ImageZipDataset(str(out / "mnist" / "mnist-32x32-test.zip"))[3]["condition"] == int(mnist["test"][1][3])

    listed = download("--list", "--output-dir", str(out), tmp_path=tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[1]: line for line in listed.stdout.splitlines() if line.startswith("│")}
    assert "present, verified" in rows["cifar10"] and "15, 3" in rows["cifar10"] and "162.2 MiB" in rows["cifar10"]
    assert "present, verified" in rows["mnist"] and "missing" in rows["fashion-mnist"]
    assert "local (--source)" in rows["imagenet64"] and "bundled" in rows["digits"]

    again = download("cifar10", "--output-dir", str(out), "--mirror", server.url + "/{dataset}", tmp_path=tmp_path,
                     checksums=checksums)
    assert again.returncode == 0 and "cifar10 already prepared" in again.stdout
    assert "already prepared" not in again.stderr  # said once, not also as a log line
    assert len([r for r in server.requests if "cifar" in r[0]]) == 1  # nothing downloaded the second time


def test_an_interrupted_download_resumes_with_a_range_request(server: DataServer, tmp_path: Path) -> None:
    body, _, checksums = serve_cifar10(server, tmp_path)
    cut = len(body) // 3
    server.drop_after[f"/cifar10/{ARCHIVE}"] = cut
    out = tmp_path / "data"
    args = ("cifar10", "--output-dir", str(out), "--mirror", server.url + "/{dataset}")
    first = download(*args, tmp_path=tmp_path, checksums=checksums)
    assert first.returncode == 1, first.stderr
    assert errors(first) == [f"error: download of {server.url}/cifar10/{ARCHIVE} stopped at {cut:,} of {len(body):,} "
                             "bytes; run the command again to resume"]
    assert "Traceback" not in first.stderr and not (out / "cifar10").exists()  # nothing at the destination
    listed = download("--list", "cifar10", "--output-dir", str(out), tmp_path=tmp_path)
    assert "partial download" in listed.stdout
    second = download(*args, tmp_path=tmp_path, checksums=checksums)
    assert second.returncode == 0, second.stderr
    assert server.requests == [(f"/cifar10/{ARCHIVE}", None), (f"/cifar10/{ARCHIVE}", f"bytes={cut}-")]
    assert f"resuming at {cut / 2**20:,.1f} MiB" in second.stderr
    assert files_under(out) == ["cifar10/cifar10-32x32-test.zip", "cifar10/cifar10-32x32.zip", "cifar10/manifest.json"]


def test_a_checksum_mismatch_is_one_line_and_leaves_nothing(server: DataServer, tmp_path: Path) -> None:
    serve_cifar10(server, tmp_path)
    out = tmp_path / "data"
    wrong = checksums_json(tmp_path, {ARCHIVE: "md5:" + "0" * 32})
    result = download("cifar10", "--output-dir", str(out), "--mirror", server.url + "/{dataset}", tmp_path=tmp_path,
                      checksums=wrong)
    assert result.returncode == 1
    assert len(errors(result)) == 1 and f"expected {'0' * 32}; the download was deleted" in errors(result)[0]
    assert "Traceback" not in result.stderr and not out.exists()


@pytest.mark.parametrize("checksum_of", ["full archive", "truncated bytes"])
def test_a_truncated_archive_is_one_line_and_leaves_nothing(server: DataServer, tmp_path: Path, checksum_of: str) -> None:
    full, _, _ = serve_cifar10(server, tmp_path)
    truncated = full[: len(full) * 2 // 3]
    server.files[f"/cifar10/{ARCHIVE}"] = truncated  # served completely: the file itself is cut short
    checksums = checksums_json(tmp_path, {ARCHIVE: full if checksum_of == "full archive" else truncated})
    out = tmp_path / "data"
    result = download("cifar10", "--output-dir", str(out), "--mirror", server.url + "/{dataset}", tmp_path=tmp_path,
                      checksums=checksums)
    assert result.returncode == 1 and len(errors(result)) == 1 and "Traceback" not in result.stderr
    if checksum_of == "full archive":
        assert f"is {md5(truncated)[4:]}, expected {md5(full)[4:]}" in errors(result)[0]
    else:  # it verifies (a mirror's own checksum), but cannot be read: deleted so that the next run fetches it again
        assert f"cannot read {ARCHIVE}" in errors(result)[0] and "truncated" in errors(result)[0]
    assert not out.exists()


def test_list_reports_corrupt_and_unverified_copies(tmp_path: Path) -> None:
    out = tmp_path / "data"
    assert download("digits", "--output-dir", str(out), tmp_path=tmp_path).returncode == 0
    zip_path = out / "digits" / "digits-8x8-val.zip"
    zip_path.write_bytes(zip_path.read_bytes()[:-100])
    rows = download("--list", "digits", "--output-dir", str(out), tmp_path=tmp_path).stdout
    assert "corrupt" in rows and "digits-8x8-val.zip has" in rows
    (out / "digits" / "manifest.json").unlink()
    assert "unverified" in download("--list", "digits", "--output-dir", str(out), tmp_path=tmp_path).stdout
    repaired = download("digits", "--output-dir", str(out), tmp_path=tmp_path)  # not ready: prepared again
    assert repaired.returncode == 0 and "digits ready" in repaired.stdout
    assert "present, verified" in download("--list", "--output-dir", str(out), tmp_path=tmp_path).stdout


def test_default_output_is_the_data_root(tmp_path: Path) -> None:
    result = download("digits", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "default_root" / "digits" / "digits-8x8.zip").is_file()


def test_imagenet64_from_both_layouts(tmp_path: Path) -> None:
    outputs = []
    for layout in ("kaggle", "ilsvrc"):
        source = fake_imagenet(tmp_path / layout, layout)
        out = tmp_path / f"out_{layout}"
        result = download("imagenet64", "--source", str(source), "--output-dir", str(out), tmp_path=tmp_path)
        assert result.returncode == 0, result.stderr
        assert f"imagenet64 ready in {out / 'imagenet64'}: imagenet-64x64.zip (6 images)" in result.stdout
        with zipfile.ZipFile(out / "imagenet64" / "imagenet-64x64.zip") as archive:
            outputs.append({name: archive.read(name) for name in archive.namelist()})
    assert outputs[0] == outputs[1]  # the same images and labels from either layout


@pytest.mark.parametrize(("args", "message"), [
    (("cifar",), "unknown dataset 'cifar'; did you mean 'cifar10'?"),
    ((), "name a dataset to prepare"),
    (("imagenet64",), "imagenet64 is made from a local ImageNet download: give --source DIR"),
    (("cifar10", "--source", "/somewhere"), "--source is the local ImageNet download for imagenet64"),
    (("mnist", "--mirror", "ftp://host/x"), "must be an http://, https:// or file:// URL"),
    (("mnist", "fashion-mnist", "--mirror", "https://host/x"), "both have a file train-images-idx3-ubyte.gz"),
    (("imagenet64", "--source", "/nonexistent_imagenet"), "--source /nonexistent_imagenet is not a folder"),
])
def test_usage_errors_are_one_line_exit_2(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    result = download(*args, "--output-dir", str(tmp_path / "data"), tmp_path=tmp_path)
    assert result.returncode == 2, result.stderr
    assert len(errors(result)) == 1 and message in errors(result)[0]
    assert not (tmp_path / "data").exists()


def test_help_has_examples_and_the_command_is_listed(tmp_path: Path) -> None:
    helped = run_cli("download-data", "--help", cwd=tmp_path)
    assert helped.returncode == 0
    for fragment in ("fastgen download-data cifar10", "--source /datasets/imagenet", "fastgen download-data --list",
                     "FASTGEN_DATA_CHECKSUMS", "Exit status"):
        assert fragment in helped.stdout
    assert "download-data" in run_cli("--help", cwd=tmp_path).stdout


def test_the_seed_script_is_the_same_command(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "download_data.py"), "digits", "--output-dir",
                             str(tmp_path / "data")], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "data" / "digits" / "digits-8x8-val.zip").is_file()


def test_the_progress_bar_shows_bytes_rate_and_eta(server: DataServer, tmp_path: Path) -> None:
    from rich.console import Console

    from fastgen.cli import common
    from fastgen.cli.download_data import BarProgress
    from fastgen.datasets.download import Checksum, fetch

    body = bytes(3 * 2**20)
    server.files["/f.bin"] = body
    recording = Console(record=True, force_terminal=True, width=150, file=open(tmp_path / "tty", "w"))  # noqa: SIM115
    saved, common._console = common._console, recording
    try:
        fetch(server.url + "/f.bin", tmp_path / "f.bin", Checksum.parse(md5(body)), BarProgress())
    finally:
        common._console = saved
        recording.file.close()
    text = recording.export_text()
    assert "f.bin" in text and "3.1/3.1 MB" in text and "/s" in text and "ETA" in text

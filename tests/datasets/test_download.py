"""``fastgen.datasets.download`` / ``prepare`` / ``sources`` in process, against a loopback HTTP server serving
files in the datasets' real formats, written by the tests (``tests/dataset_files.py``)."""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from dataset_files import (SYNSETS, DataServer, cifar10_tarball, data_server, fake_imagenet, md5, mnist_files,
                           pad32)

from fastgen.datasets.download import Checksum, DownloadError, fetch, part_path
from fastgen.datasets.image_zip import ImageZipDataset
from fastgen.datasets.prepare import DATASETS, dataset_status, prepare, prepare_hint, resolve_names
from fastgen.utils.errors import UsageError


@pytest.fixture
def server() -> Iterator[DataServer]:
    with data_server() as srv:
        yield srv


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


# ------------------------------------------------------------------------------------------------- fetch
def test_an_interrupted_download_resumes_from_where_it_stopped(server: DataServer, tmp_path: Path) -> None:
    body = np.random.default_rng(0).integers(0, 256, 3 * 2**20 + 123, dtype=np.uint8).tobytes()
    server.files["/f.bin"] = body
    server.drop_after["/f.bin"] = 1_000_000
    destination = tmp_path / "f.bin"
    with pytest.raises(DownloadError, match=f"stopped at 1,000,000 of {len(body):,} bytes; run the command again"):
        fetch(server.url + "/f.bin", destination, Checksum.parse(md5(body)))
    assert not destination.exists() and part_path(destination).stat().st_size == 1_000_000
    fetch(server.url + "/f.bin", destination, Checksum.parse(md5(body)))
    assert destination.read_bytes() == body and not part_path(destination).exists()
    assert server.requests == [("/f.bin", None), ("/f.bin", "bytes=1000000-")]


def test_a_server_without_range_support_sends_everything_again(server: DataServer, tmp_path: Path,
                                                               fastgen_records: pytest.LogCaptureFixture) -> None:
    body = bytes(range(256)) * 1000
    server.files["/f.bin"], server.ranges = body, False
    destination = tmp_path / "f.bin"
    part_path(destination).write_bytes(body[:5000])
    fetch(server.url + "/f.bin", destination, Checksum.parse(md5(body)))
    assert destination.read_bytes() == body
    assert server.requests == [("/f.bin", "bytes=5000-")]
    assert "does not resume downloads" in fastgen_records.text


def test_a_complete_part_file_is_finished_without_downloading(server: DataServer, tmp_path: Path) -> None:
    body = b"x" * 10_000
    server.files["/f.bin"] = body
    destination = tmp_path / "f.bin"
    part_path(destination).write_bytes(body)
    fetch(server.url + "/f.bin", destination, Checksum.parse(md5(body)))  # the server answers 416
    assert destination.read_bytes() == body


def test_a_checksum_mismatch_leaves_nothing(server: DataServer, tmp_path: Path) -> None:
    server.files["/f.bin"] = b"the bytes" * 100
    destination = tmp_path / "f.bin"
    with pytest.raises(DownloadError) as info:
        fetch(server.url + "/f.bin", destination, Checksum.parse("md5:" + "0" * 32))
    assert f"is {md5(b'the bytes' * 100)[4:]}, expected {'0' * 32}" in str(info.value)
    assert "\n" not in str(info.value) and files_under(tmp_path) == []


def test_a_verified_file_is_reused_and_a_wrong_one_replaced(server: DataServer, tmp_path: Path) -> None:
    body = b"payload" * 50
    server.files["/f.bin"] = body
    destination = tmp_path / "f.bin"
    destination.write_bytes(body)
    fetch(server.url + "/f.bin", destination, Checksum.parse(md5(body)))
    assert server.requests == []
    destination.write_bytes(b"stale")
    fetch(server.url + "/f.bin", destination, Checksum.parse(md5(body)))
    assert destination.read_bytes() == body and len(server.requests) == 1


def test_unreachable_server_and_http_errors_are_one_line(server: DataServer, tmp_path: Path) -> None:
    from fastgen_testing import free_port

    with pytest.raises(DownloadError, match=r"cannot reach http://127\.0\.0\.1:\d+/f: .*Connection refused.*; run the command again"):
        fetch(f"http://127.0.0.1:{free_port()}/f", tmp_path / "f", Checksum.parse("md5:" + "0" * 32))
    with pytest.raises(DownloadError, match="HTTP 404"):
        fetch(server.url + "/absent", tmp_path / "f", Checksum.parse("md5:" + "0" * 32))
    assert files_under(tmp_path) == []


@pytest.mark.parametrize(("text", "expected"), [
    ("md5:C32A1D4AB5D03F1284B67883E8D87530", ("md5", "c32a1d4ab5d03f1284b67883e8d87530")),
    ("c32a1d4ab5d03f1284b67883e8d87530", ("md5", "c32a1d4ab5d03f1284b67883e8d87530")),
    ("sha256:" + "ab" * 32, ("sha256", "ab" * 32)),
    ("ab" * 32, ("sha256", "ab" * 32)),
])
def test_checksum_parsing(text: str, expected: tuple[str, str]) -> None:
    parsed = Checksum.parse(text)
    assert (parsed.algorithm, parsed.hexdigest) == expected


@pytest.mark.parametrize("text", ["md5:abc", "sha1:" + "a" * 40, "md5:" + "g" * 32, ""])
def test_bad_checksums_are_usage_errors(text: str) -> None:
    with pytest.raises(UsageError, match="not md5:<32 hex digits> or sha256:<64 hex digits>"):
        Checksum.parse(text)


def test_the_table_holds_the_published_checksums() -> None:
    table = {f.name + "@" + name: f.checksum for name, spec in DATASETS.items() for f in spec.files}
    assert table["cifar-10-binary.tar.gz@cifar10"] == "md5:c32a1d4ab5d03f1284b67883e8d87530"
    assert table["train-images-idx3-ubyte.gz@mnist"] == "md5:f68b3c2dcbeaaa9fbdd348bbdeb94873"
    assert table["t10k-labels-idx1-ubyte.gz@mnist"] == "md5:ec29112dd5afa0611ce80d1b7f02629c"
    assert table["train-images-idx3-ubyte.gz@fashion-mnist"] == "md5:8d4fb7e6c68d591d4c3dfef9ec88bf0d"
    assert table["t10k-labels-idx1-ubyte.gz@fashion-mnist"] == "md5:bb300cfdad3c16e7a12a480ee83cd310"
    assert all(Checksum.parse(c) for c in table.values())


# ----------------------------------------------------------------------------------------------- prepare
def test_cifar10_round_trip_download_verify_convert_load(server: DataServer, tmp_path: Path) -> None:
    body, written = cifar10_tarball(tmp_path, per_file=3)
    server.files["/cifar10/cifar-10-binary.tar.gz"] = body
    root = tmp_path / "data"
    done = prepare("cifar10", root, mirror=server.url + "/{dataset}", checksums={"cifar-10-binary.tar.gz": md5(body)})
    assert done.images == {"cifar10-32x32.zip": 15, "cifar10-32x32-test.zip": 3}
    assert files_under(root) == ["cifar10/cifar10-32x32-test.zip", "cifar10/cifar10-32x32.zip",
                                 "cifar10/manifest.json"]  # no staging left
    for split, file in (("train", "cifar10-32x32.zip"), ("test", "cifar10-32x32-test.zip")):
        images, labels = written[split]
        dataset = ImageZipDataset(str(root / "cifar10" / file))
        batch = dataset.get_batch(torch.arange(len(dataset)))
        expected = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 127.5 - 1
        assert torch.equal(batch["real"], expected)
        assert torch.equal(batch["condition"], torch.from_numpy(labels))
    assert dataset_status("cifar10", root).state == "ready"
    again = prepare("cifar10", root, mirror=server.url + "/{dataset}", checksums={"cifar-10-binary.tar.gz": md5(body)})
    assert again.already and len(server.requests) == 1


def test_mnist_and_fashion_mnist_from_idx_files(server: DataServer, tmp_path: Path) -> None:
    root = tmp_path / "data"
    for name, seed in (("mnist", 0), ("fashion-mnist", 5)):
        files, written = mnist_files(train=7, test=3, seed=seed)
        for file, data in files.items():
            server.files[f"/{name}/{file}"] = data
        done = prepare(name, root, mirror=server.url + "/{dataset}", checksums={f: md5(d) for f, d in files.items()})
        assert sorted(done.images.values()) == [3, 7]
        for split, suffix in (("train", ""), ("test", "-test")):
            dataset = ImageZipDataset(str(root / name / f"{name}-32x32{suffix}.zip"))
            assert dataset.image_shape == (1, 32, 32) and len(dataset) == len(written[split][1])
            batch = dataset.get_batch(torch.arange(len(dataset)))
            expected = torch.from_numpy(pad32(written[split][0])).unsqueeze(1).float() / 127.5 - 1
            assert torch.equal(batch["real"], expected)
            assert torch.equal(batch["condition"], torch.from_numpy(written[split][1]))


def test_an_idx_file_with_a_wrong_magic_is_refused_and_deleted(server: DataServer, tmp_path: Path) -> None:
    import gzip

    files, _ = mnist_files()
    files["t10k-images-idx3-ubyte.gz"] = gzip.compress(b"\x00\x00\x08\x01" + gzip.decompress(files["t10k-images-idx3-ubyte.gz"])[4:])
    for file, data in files.items():
        server.files[f"/{file}"] = data
    root = tmp_path / "data"
    with pytest.raises(DownloadError, match="t10k-images-idx3-ubyte.gz is not an IDX image file"):
        prepare("mnist", root, mirror=server.url, checksums={f: md5(d) for f, d in files.items()})
    assert files_under(root) == []  # nothing placed; the unreadable downloads were deleted too


def _symlink(name: str, to: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.SYMTYPE
    info.linkname = to
    return info


@pytest.mark.parametrize(("member", "fragment"), [
    (tarfile.TarInfo("cifar-10-batches-bin/../../escaped.bin"), "absolute path or '..'"),
    (tarfile.TarInfo("/tmp/absolute.bin"), "absolute path or '..'"),
    (_symlink("cifar-10-batches-bin/link", "/etc/passwd"), "not a regular file or folder"),
    (tarfile.TarInfo("elsewhere/readme.txt"), "outside cifar-10-batches-bin/"),
])
def test_unsafe_archive_members_are_refused(server: DataServer, tmp_path: Path, member: tarfile.TarInfo,
                                            fragment: str) -> None:
    body, _ = cifar10_tarball(tmp_path, per_file=1, extra=[member])
    server.files["/cifar-10-binary.tar.gz"] = body
    root = tmp_path / "data"
    with pytest.raises(DownloadError, match="refusing archive member") as info:
        prepare("cifar10", root, mirror=server.url, checksums={"cifar-10-binary.tar.gz": md5(body)})
    assert fragment in str(info.value)
    assert files_under(root) == [] and not list(tmp_path.rglob("escaped.bin"))


def test_an_archive_with_malformed_records_is_refused(server: DataServer, tmp_path: Path) -> None:
    body, _ = cifar10_tarball(tmp_path, mutate=lambda folder: (folder / "data_batch_3.bin").write_bytes(b"x" * 100))
    server.files["/cifar-10-binary.tar.gz"] = body
    with pytest.raises(DownloadError, match="not CIFAR-10 binary data: data_batch_3.bin has 100 bytes"):
        prepare("cifar10", tmp_path / "data", mirror=server.url, checksums={"cifar-10-binary.tar.gz": md5(body)})


def test_digits_export_matches_digits_dataset(tmp_path: Path) -> None:
    from fastgen.datasets.digits import DigitsDataset

    done = prepare("digits", tmp_path)
    assert done.images == {"digits-8x8.zip": 1617, "digits-8x8-val.zip": 180}
    for split, file in (("train", "digits-8x8.zip"), ("val", "digits-8x8-val.zip")):
        reference = DigitsDataset(split=split)
        exported = ImageZipDataset(str(tmp_path / "digits" / file)).get_batch(torch.arange(len(reference)))
        assert torch.equal(exported["condition"], reference.labels)
        assert (exported["real"] - reference.images).abs().max() <= 1 / 255 + 1e-6  # half an 8-bit step (2/255)


@pytest.mark.parametrize("layout", ["kaggle", "ilsvrc"])
def test_imagenet64_from_a_local_folder_uses_edms_center_crop(tmp_path: Path, layout: str) -> None:
    import PIL.Image

    source = fake_imagenet(tmp_path / "imagenet", layout)
    done = prepare("imagenet64", tmp_path / "data", source=source, workers=1)
    dataset = ImageZipDataset(str(tmp_path / "data" / "imagenet64" / "imagenet-64x64.zip"))
    assert done.images == {"imagenet-64x64.zip": 6} and dataset.image_shape == (3, 64, 64)
    files = sorted((source / ("ILSVRC/Data/CLS-LOC/train" if layout == "kaggle" else "train")).rglob("*.JPEG"))
    batch = dataset.get_batch(torch.arange(len(files)))
    for i, path in enumerate(files):
        # EDM dataset_tool.py --transform=center-crop: the centred min(H, W) square, Lanczos to 64x64.
        array = np.asarray(PIL.Image.open(path).convert("RGB"))
        h, w = array.shape[:2]
        c = min(h, w)
        crop = array[(h - c) // 2:(h + c) // 2, (w - c) // 2:(w + c) // 2]
        expected = np.array(PIL.Image.fromarray(crop).resize((64, 64), PIL.Image.Resampling.LANCZOS))
        assert torch.equal(batch["real"][i], torch.from_numpy(expected).permute(2, 0, 1).float() / 127.5 - 1)
        assert int(batch["condition"][i]) == SYNSETS.index(path.parent.name)  # sorted synset order


def test_imagenet64_in_a_process_pool_matches_the_serial_result(tmp_path: Path) -> None:
    source = fake_imagenet(tmp_path / "imagenet", "ilsvrc", per_class=30)  # 90 images: above the pool threshold
    import zipfile

    contents = []
    for name, workers in (("serial", 1), ("pool", 2)):
        prepare("imagenet64", tmp_path / name, source=source, workers=workers)
        with zipfile.ZipFile(tmp_path / name / "imagenet64" / "imagenet-64x64.zip") as archive:
            contents.append({member: archive.read(member) for member in archive.namelist()})
    assert len(contents[0]) == 91 and contents[0] == contents[1]  # 90 images + dataset.json, in the same order


def test_imagenet_without_synset_folders_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "wrong" / "cats").mkdir(parents=True)
    with pytest.raises(UsageError, match="no ImageNet training folder under .*ILSVRC/Data/CLS-LOC/train"):
        prepare("imagenet64", tmp_path / "data", source=tmp_path / "wrong")
    with pytest.raises(UsageError, match="give --source DIR"):
        prepare("imagenet64", tmp_path / "data")


def test_resolve_names() -> None:
    assert resolve_names(["all"], has_source=False) == ["cifar10", "mnist", "fashion-mnist", "digits"]
    assert resolve_names(["digits", "CIFAR10", "all"], has_source=True) == list(DATASETS)
    with pytest.raises(UsageError, match="did you mean 'fashion-mnist'"):
        resolve_names(["fashion_mnist"], has_source=False)


def test_prepare_hint_names_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATA_ROOT_DIR", str(tmp_path / "root"))
    assert prepare_hint(tmp_path / "root" / "cifar10" / "cifar10-32x32.zip") == "fastgen download-data cifar10"
    assert prepare_hint(tmp_path / "x" / "mnist" / "mnist-32x32-test.zip") == \
        f"fastgen download-data mnist --output-dir {tmp_path / 'x'}"
    assert prepare_hint(tmp_path / "root" / "imagenet64" / "imagenet-64x64.zip") == \
        "fastgen download-data imagenet64 --source IMAGENET_DIR"
    assert prepare_hint(tmp_path / "root" / "cifar10" / "mine.zip") is None


def test_checksum_overrides_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastgen.datasets.prepare import checksum_overrides

    monkeypatch.setenv("FASTGEN_DATA_CHECKSUMS", '{"a.gz": "md5:' + "1" * 32 + '"}')
    assert checksum_overrides({"b.gz": "sha256:" + "2" * 64}) == {
        "a.gz": Checksum("md5", "1" * 32), "b.gz": Checksum("sha256", "2" * 64)}
    (tmp_path / "sums.json").write_text('{"a.gz": "' + "3" * 32 + '"}')
    monkeypatch.setenv("FASTGEN_DATA_CHECKSUMS", str(tmp_path / "sums.json"))
    assert checksum_overrides() == {"a.gz": Checksum("md5", "3" * 32)}
    monkeypatch.setenv("FASTGEN_DATA_CHECKSUMS", "{not json")
    with pytest.raises(UsageError, match="FASTGEN_DATA_CHECKSUMS must be a JSON object"):
        checksum_overrides()
    monkeypatch.setenv("FASTGEN_DATA_CHECKSUMS", str(tmp_path / "absent.json"))
    with pytest.raises(UsageError, match="cannot read it"):
        checksum_overrides()

"""WebDataset shards on a real SeaweedFS S3 server: listing below a prefix, streamed reads that match the local
ones, and a body that breaks off mid-shard reopened at the byte it reached."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastgen.datasets import webdataset
from fastgen.datasets.webdataset import list_shards, read_samples, write_shards
from s3server import S3Server


@pytest.fixture
def shards_on_s3(tmp_path: Path, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    webdataset._STORAGE.clear()  # a client for this server's environment
    samples = [{"__key__": f"k{i:03d}", "bin": bytes([i % 251]) * 5000} for i in range(30)]
    write_shards(samples, tmp_path / "local", 10)
    client = s3_server.client()
    for shard in sorted((tmp_path / "local").iterdir()):
        client.upload_file(str(shard), s3_server.bucket, f"wds-unit/train/{shard.name}")
    client.put_object(Bucket=s3_server.bucket, Key="wds-unit/train/README.txt", Body=b"not a shard")
    client.put_object(Bucket=s3_server.bucket, Key="wds-unit/train-extra/x.tar", Body=b"a sibling prefix")
    yield f"s3://{s3_server.bucket}/wds-unit/train", tmp_path / "local"
    webdataset._STORAGE.clear()


def test_an_s3_prefix_lists_its_tar_keys_only_and_reads_like_the_local_files(shards_on_s3: tuple[str, Path]) -> None:
    prefix, local = shards_on_s3
    shards = list_shards([prefix])
    assert shards == [f"{prefix}/shard-00000{i}.tar" for i in range(3)]
    for url in shards:
        remote = [(s.key, s.offset, s.fields) for s in read_samples(url)]
        assert remote == [(s.key, s.offset, s.fields) for s in read_samples(str(local / Path(url).name))]
    middle = list(read_samples(shards[1]))[4]
    assert [s.key for s in read_samples(shards[1], middle.offset, 4)][:2] == ["k014", "k015"]


def test_a_body_that_breaks_off_is_reopened_at_the_byte_it_reached(shards_on_s3: tuple[str, Path],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from botocore.exceptions import ResponseStreamingError

    prefix, local = shards_on_s3
    ranges: list[int] = []
    real_open = webdataset._S3RangeReader._open

    class Breaking:
        """The first body: 20,000 bytes, then the connection drops."""

        def __init__(self, body) -> None:
            self.body, self.left = body, 20_000

        def read(self, size: int) -> bytes:
            if self.left <= 0:
                raise ResponseStreamingError(error="connection reset by peer")
            data = self.body.read(min(size, self.left))
            self.left -= len(data)
            return data

        def close(self) -> None:
            self.body.close()

    def counted_open(self):
        ranges.append(self.position)
        body = real_open(self)
        return Breaking(body) if len(ranges) == 1 else body

    monkeypatch.setattr(webdataset._S3RangeReader, "_open", counted_open)
    url = f"{prefix}/shard-000000.tar"
    assert [s.fields for s in read_samples(url)] == [s.fields for s in read_samples(str(local / "shard-000000.tar"))]
    assert ranges == [0, 20_000]

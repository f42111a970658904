"""Test helpers for the data pipeline: a loopback HTTP server with Range support, and writers of the datasets'
real published formats (CIFAR-10's binary tarball, MNIST's IDX ``.gz`` files, ImageNet's JPEG folder layouts)."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import io
import json
import struct
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from fastgen_testing import write_cifar10_binary


class DataServer:
    """Serves ``files`` (URL path -> bytes) on 127.0.0.1 at a free port.

    ``Range: bytes=N-`` is honoured (206 + Content-Range) while ``ranges`` is on, else the whole file is sent (200).
    ``drop_after[path] = n`` makes the next answer for ``path`` announce the full length, send ``n`` bytes of the body
    and close the connection (one-shot), like a network failure midway. Every request is recorded as
    ``(path, Range header or None)``.
    """

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.requests: list[tuple[str, str | None]] = []
        self.drop_after: dict[str, int] = {}
        self.ranges = True
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                wanted = self.headers.get("Range")
                server.requests.append((self.path, wanted))
                body = server.files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                start = 0
                if server.ranges and wanted and wanted.startswith("bytes=") and wanted.endswith("-"):
                    start = int(wanted[len("bytes="):-1])
                    if start >= len(body):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(body)}")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                cut = server.drop_after.pop(self.path, None)
                self.wfile.write(body[start:] if cut is None else body[start:start + cut])
                self.wfile.flush()
                self.close_connection = True

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


@contextmanager
def data_server() -> Iterator[DataServer]:
    server = DataServer()
    try:
        yield server
    finally:
        server.close()


def md5(data: bytes) -> str:
    return "md5:" + hashlib.md5(data).hexdigest()  # noqa: S324 - the datasets' published checksum kind


def checksums_json(tmp_path: Path, table: dict[str, bytes | str]) -> Path:
    """A ``FASTGEN_DATA_CHECKSUMS`` file: file name -> md5 of the given bytes (or a checksum string as is)."""
    path = tmp_path / "checksums.json"
    path.write_text(json.dumps({k: (md5(v) if isinstance(v, bytes) else v) for k, v in table.items()}))
    return path


# ---------------------------------------------------------------------------------------------------- CIFAR-10
def cifar10_tarball(tmp_path: Path, per_file: int = 3, seed: int = 11, extra: list[tarfile.TarInfo] | None = None,
                    mutate=None) -> tuple[bytes, dict[str, tuple[np.ndarray, np.ndarray]]]:  # noqa: ANN001
    """A ``cifar-10-binary.tar.gz`` laid out like the official one (``cifar-10-batches-bin/`` with the five train
    batches, the test batch, ``batches.meta.txt`` and ``readme.html``), ``per_file`` records per batch. Returns the
    bytes and ``{"train"|"test": (images (N, 32, 32, 3) uint8 HWC, labels (N,))}`` as written."""
    folder = tmp_path / "cifar_build" / "cifar-10-batches-bin"
    written = write_cifar10_binary(folder, per_file=per_file, seed=seed)
    (folder / "batches.meta.txt").write_text("airplane\nautomobile\nbird\ncat\ndeer\ndog\nfrog\nhorse\nship\ntruck\n")
    (folder / "readme.html").write_text("<html></html>\n")
    if mutate is not None:
        mutate(folder)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(folder, arcname="cifar-10-batches-bin")
        for info in extra or []:
            data = b"evil" if info.isfile() else None
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)

    def split(names: list[str]) -> tuple[np.ndarray, np.ndarray]:
        images = np.concatenate([written[n][0].permute(0, 2, 3, 1).numpy() for n in names])
        labels = np.concatenate([written[n][1].numpy() for n in names])
        return images, labels

    return buffer.getvalue(), {"train": split([f"data_batch_{i}.bin" for i in range(1, 6)]),
                               "test": split(["test_batch.bin"])}


# ------------------------------------------------------------------------------------------------------ MNIST
def idx_files(count: int, seed: int = 0, rows: int = 28, cols: int = 28) -> tuple[bytes, bytes, np.ndarray, np.ndarray]:
    """Gzipped IDX image and label files (real headers: magic 0x803 / 0x801, big-endian sizes) of ``count``
    random images; returns (images .gz, labels .gz, images (N, rows, cols), labels (N,))."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(count, rows, cols), dtype=np.uint8)
    labels = rng.integers(0, 10, size=count, dtype=np.uint8)
    image_file = struct.pack(">IIII", 0x00000803, count, rows, cols) + images.tobytes()
    label_file = struct.pack(">II", 0x00000801, count) + labels.tobytes()
    return gzip.compress(image_file), gzip.compress(label_file), images, labels.astype(np.int64)


def mnist_files(train: int = 7, test: int = 3, seed: int = 0) -> tuple[dict[str, bytes], dict[str, tuple]]:
    """The four MNIST file names -> gzipped IDX bytes, and ``{"train"|"test": (images, labels)}``."""
    tr_img, tr_lab, tr_x, tr_y = idx_files(train, seed)
    te_img, te_lab, te_x, te_y = idx_files(test, seed + 1)
    files = {"train-images-idx3-ubyte.gz": tr_img, "train-labels-idx1-ubyte.gz": tr_lab,
             "t10k-images-idx3-ubyte.gz": te_img, "t10k-labels-idx1-ubyte.gz": te_lab}
    return files, {"train": (tr_x, tr_y), "test": (te_x, te_y)}


def pad32(images: np.ndarray) -> np.ndarray:
    """28x28 -> 32x32 with 2 zero pixels on every side (EDM's dataset_tool.py for MNIST)."""
    return np.pad(images, [(0, 0), (2, 2), (2, 2)])


# --------------------------------------------------------------------------------------------------- ImageNet
SYNSETS = ("n01440764", "n01443537", "n02085620")


def fake_imagenet(root: Path, layout: str, per_class: int = 2, seed: int = 0) -> Path:
    """A tiny ImageNet training folder of real JPEG files (various sizes and aspect ratios, one grayscale image,
    one CMYK) in the ``kaggle`` (``ILSVRC/Data/CLS-LOC/train/nXXXXXXXX/``, with ``LOC_synset_mapping.txt``) or
    ``ilsvrc`` (``train/nXXXXXXXX/``) layout; returns the folder to give as ``--source``."""
    import PIL.Image

    rng = np.random.default_rng(seed)
    train = root / ("ILSVRC/Data/CLS-LOC/train" if layout == "kaggle" else "train")
    sizes = [(97, 80), (64, 130), (150, 150), (75, 101), (200, 90), (66, 66)]
    k = 0
    for synset in reversed(SYNSETS):  # written out of order: the label order must come from sorting
        (train / synset).mkdir(parents=True)
        for i in range(per_class):
            height, width = sizes[k % len(sizes)]
            pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
            image = PIL.Image.fromarray(pixels, "RGB")
            if k == 1:
                image = image.convert("L")
            elif k == 2:
                image = image.convert("CMYK")
            image.save(train / synset / f"{synset}_{i + 1:05d}.JPEG", format="JPEG", quality=90)
            k += 1
    if layout == "kaggle":
        (root / "LOC_synset_mapping.txt").write_text("".join(f"{s} class {s}\n" for s in SYNSETS))
    return root

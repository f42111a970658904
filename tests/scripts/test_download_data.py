"""``scripts/download_data.py cifar10`` against a loopback HTTP server serving tarballs the tests build themselves.

The archives hold a few records per file in CIFAR-10's real binary layout, in the official archive's folder
structure; the expected md5 is passed with ``--md5`` (the real archive's is the default).
"""

from __future__ import annotations

import hashlib
import http.server
import io
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from fastgen_testing import write_cifar10_binary

from fastgen.datasets.cifar10 import CIFAR10Dataset

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "download_data.py"
PER_FILE = 4


class Server:
    """Serves ``files`` (path -> bytes) on 127.0.0.1, honouring ``Range: bytes=N-`` when ``ranges`` is on."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.requests: list[tuple[str, str | None]] = []
        self.ranges = True
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                server.requests.append((self.path, self.headers.get("Range")))
                body = server.files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                start = 0
                wanted = self.headers.get("Range")
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
                self.wfile.write(body[start:])

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


@pytest.fixture
def server() -> Iterator[Server]:
    srv = Server()
    try:
        yield srv
    finally:
        srv.close()


def cifar_tarball(tmp_path: Path, extra: list[tarfile.TarInfo] | None = None, mutate=None) -> tuple[bytes, dict]:  # noqa: ANN001
    """A .tar.gz laid out like the official one: cifar-10-batches-bin/{data_batch_1..5,test_batch}.bin + meta."""
    folder = tmp_path / "build" / "cifar-10-batches-bin"
    written = write_cifar10_binary(folder, per_file=PER_FILE, seed=11)
    (folder / "batches.meta.txt").write_text("airplane\nautomobile\nbird\ncat\ndeer\ndog\nfrog\nhorse\nship\ntruck\n")
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
    return buffer.getvalue(), written


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()  # noqa: S324


def run_script(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    import os

    full_env = {k: v for k, v in os.environ.items() if k != "DATA_ROOT_DIR"}
    full_env.update(env or {})
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=120)


def error_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def leftovers(target: Path) -> list[str]:
    return sorted(p.name for p in target.iterdir()) if target.exists() else []


def test_downloads_verifies_extracts_and_the_dataset_loads(server: Server, tmp_path: Path) -> None:
    body, written = cifar_tarball(tmp_path)
    server.files["/cifar-10-binary.tar.gz"] = body
    root = tmp_path / "data"
    result = run_script("cifar10", "--root", str(root), "--url", server.url + "/cifar-10-binary.tar.gz",
                        "--md5", md5(body), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "downloading http://127.0.0.1" in result.stderr and "100%" in result.stderr
    assert f"CIFAR-10 ready in {root / 'cifar10'} (20 train images, 4 test images)" in result.stderr
    assert leftovers(root / "cifar10") == ["cifar-10-batches-bin"]  # no archive, .part or staging folder left
    train = CIFAR10Dataset(str(root / "cifar10"))
    expected = torch.cat([written[f"data_batch_{i}.bin"][0] for i in range(1, 6)]).float() / 127.5 - 1
    assert torch.equal(train.get_batch(torch.arange(20))["real"], expected)
    assert len(CIFAR10Dataset(str(root / "cifar10"), split="test")) == PER_FILE

    again = run_script("cifar10", "--root", str(root), "--url", server.url + "/cifar-10-binary.tar.gz",
                       "--md5", md5(body), cwd=tmp_path)
    assert again.returncode == 0 and "already prepared" in again.stderr
    assert len(server.requests) == 1  # nothing downloaded the second time


def test_data_root_from_the_environment_and_keep_archive(server: Server, tmp_path: Path) -> None:
    body, _ = cifar_tarball(tmp_path)
    server.files["/c.tar.gz"] = body
    root = tmp_path / "from_env"
    result = run_script("cifar10", "--url", server.url + "/c.tar.gz", "--md5", md5(body), "--keep-archive",
                        cwd=tmp_path, env={"DATA_ROOT_DIR": str(root)})
    assert result.returncode == 0, result.stderr
    assert leftovers(root / "cifar10") == ["cifar-10-batches-bin", "cifar-10-binary.tar.gz"]
    # --force with the archive present re-extracts from it without downloading.
    forced = run_script("cifar10", "--url", server.url + "/c.tar.gz", "--md5", md5(body), "--force",
                        cwd=tmp_path, env={"DATA_ROOT_DIR": str(root)})
    assert forced.returncode == 0, forced.stderr
    assert "using the verified archive" in forced.stderr and len(server.requests) == 1
    assert len(CIFAR10Dataset(str(root / "cifar10"))) == 5 * PER_FILE


def test_md5_mismatch_fails_cleanly(server: Server, tmp_path: Path) -> None:
    body, _ = cifar_tarball(tmp_path)
    server.files["/c.tar.gz"] = body
    root = tmp_path / "data"
    result = run_script("cifar10", "--root", str(root), "--url", server.url + "/c.tar.gz", "--md5", "0" * 32,
                        cwd=tmp_path)
    assert result.returncode == 1
    errors = error_lines(result)
    assert len(errors) == 1 and f"is {md5(body)}, expected {'0' * 32}" in errors[0]
    assert "Traceback" not in result.stderr
    assert leftovers(root / "cifar10") == []


def test_default_md5_is_the_official_one(server: Server, tmp_path: Path) -> None:
    body, _ = cifar_tarball(tmp_path)
    server.files["/c.tar.gz"] = body
    result = run_script("cifar10", "--root", str(tmp_path / "data"), "--url", server.url + "/c.tar.gz", cwd=tmp_path)
    assert result.returncode == 1
    assert "expected c32a1d4ab5d03f1284b67883e8d87530" in error_lines(result)[0]


@pytest.mark.parametrize("server_ranges", [True, False])
def test_a_partial_download_resumes(server: Server, tmp_path: Path, server_ranges: bool) -> None:
    body, _ = cifar_tarball(tmp_path)
    server.files["/c.tar.gz"] = body
    server.ranges = server_ranges
    target = tmp_path / "data" / "cifar10"
    target.mkdir(parents=True)
    half = len(body) // 2
    (target / "cifar-10-binary.tar.gz.part").write_bytes(body[:half])
    result = run_script("cifar10", "--root", str(tmp_path / "data"), "--url", server.url + "/c.tar.gz",
                        "--md5", md5(body), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert server.requests == [("/c.tar.gz", f"bytes={half}-")]
    if server_ranges:
        assert "resuming at" in result.stderr
    else:
        assert "does not resume downloads; starting" in result.stderr
    assert len(CIFAR10Dataset(str(target))) == 5 * PER_FILE
    assert leftovers(target) == ["cifar-10-batches-bin"]


def _symlink(name: str, to: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.SYMTYPE
    info.linkname = to
    return info


@pytest.mark.parametrize(
    ("member", "fragment"),
    [
        (tarfile.TarInfo("cifar-10-batches-bin/../../escaped.bin"), "absolute path or '..'"),
        (tarfile.TarInfo("/tmp/absolute.bin"), "absolute path or '..'"),
        (_symlink("cifar-10-batches-bin/link", "/etc/passwd"), "not a regular file or folder"),
        (tarfile.TarInfo("elsewhere/readme.txt"), "outside cifar-10-batches-bin/"),
    ],
)
def test_unsafe_archive_members_are_refused(server: Server, tmp_path: Path, member: tarfile.TarInfo, fragment: str) -> None:
    body, _ = cifar_tarball(tmp_path, extra=[member])
    server.files["/c.tar.gz"] = body
    root = tmp_path / "deep" / "data"
    result = run_script("cifar10", "--root", str(root), "--url", server.url + "/c.tar.gz", "--md5", md5(body),
                        cwd=tmp_path)
    assert result.returncode == 1
    errors = error_lines(result)
    assert len(errors) == 1 and "refusing archive member" in errors[0] and fragment in errors[0]
    assert not (root / "cifar10" / "cifar-10-batches-bin").exists()
    assert not [p for p in (root / "cifar10").iterdir() if p.name.startswith(".extract-")]
    assert not list(tmp_path.rglob("escaped.bin")) and not Path("/tmp/absolute.bin").exists()


def test_an_archive_with_malformed_records_is_refused(server: Server, tmp_path: Path) -> None:
    body, _ = cifar_tarball(tmp_path, mutate=lambda folder: (folder / "data_batch_3.bin").write_bytes(b"x" * 100))
    server.files["/c.tar.gz"] = body
    root = tmp_path / "data"
    result = run_script("cifar10", "--root", str(root), "--url", server.url + "/c.tar.gz", "--md5", md5(body),
                        cwd=tmp_path)
    assert result.returncode == 1
    errors = error_lines(result)
    assert len(errors) == 1 and "not CIFAR-10 binary data" in errors[0] and "data_batch_3.bin has 100 bytes" in errors[0]
    assert not (root / "cifar10" / "cifar-10-batches-bin").exists()


def test_unreachable_server_is_one_line(tmp_path: Path) -> None:
    from fastgen_testing import free_port

    result = run_script("cifar10", "--root", str(tmp_path / "data"), "--url", f"http://127.0.0.1:{free_port()}/c.tar.gz",
                        cwd=tmp_path)
    assert result.returncode == 1
    errors = error_lines(result)
    assert len(errors) == 1 and "cannot reach http://127.0.0.1" in errors[0]


def test_imagenet_is_not_supported_yet_and_help_says_so(tmp_path: Path) -> None:
    result = run_script("imagenet", cwd=tmp_path)
    assert result.returncode == 2
    assert error_lines(result) == [line for line in result.stderr.splitlines() if line.strip()]
    assert "imagenet is not supported yet" in result.stderr
    helped = run_script("--help", cwd=tmp_path)
    assert helped.returncode == 0 and "ImageNet is not supported yet" in helped.stdout.replace("\n", " ")
    assert run_script("mnist", cwd=tmp_path).returncode == 2

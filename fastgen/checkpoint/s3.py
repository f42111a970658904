"""S3 storage for checkpoints: locations, credentials, a retrying boto3 client, and DCP storage on S3.

**Locations.** ``S3Location.parse("s3://bucket/prefix/...")`` and ``S3Location.from_container("bucket/prefix")``
(the config's ``trainer.checkpointer.s3_container``) give a ``(bucket, key)`` pair. A key names an object or,
used as a folder, every key below ``key + "/"``: folder operations always add the slash, so deleting checkpoint
``1000000.dcp/`` never touches ``10000000.dcp/``.

**Credentials** (``resolve_credentials``). The key set - ``aws_access_key_id``, ``aws_secret_access_key``,
``aws_session_token`` - comes from one source, never mixed: ``credentials_dir/s3.json`` when it sets
``aws_access_key_id``, else ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN`` from the
environment (or ``.env``, or a file ``load_credentials`` exported earlier), else boto3's own chain (``AWS_PROFILE``,
``~/.aws/credentials``, an instance role). ``region_name`` and ``endpoint_url`` are taken field by field, the file
first, then ``AWS_REGION`` / ``AWS_DEFAULT_REGION`` and ``AWS_ENDPOINT_URL``. ``S3Credentials.source`` names where
the keys came from (for error messages); the secret fields are left out of ``repr`` and never logged or put in an
error message.

**Client** (``S3Storage``). boto3 is imported and the client created on first use, and the DCP classes (torch)
are built on first access, so importing this module costs nothing and ``fastgen --help`` stays instant. An ``endpoint_url`` (SeaweedFS, MinIO, ...) switches to
path-style addressing (``http://host:port/bucket/key``), which such servers need. Every request is retried by
botocore with exponential backoff and jitter (``retries={"mode": "standard", "total_max_attempts": N}``) with connect
and read timeouts; large files go up and down in parts through boto3's ``TransferConfig`` (multipart above
``multipart_threshold``). Failures become one-line ``S3StorageError``s (a ``CheckpointError``, exit code 1):

* rejected credentials or access denied -> ``S3AccessError``: "S3 credentials from credentials/s3.json were
  rejected by http://127.0.0.1:8333 (InvalidAccessKeyId) while listing s3://bucket/run/";
* no answer after the retries -> ``S3UnreachableError``: "S3 endpoint ... did not answer while ...";
* a missing bucket or object -> ``S3NotFoundError``.

An object appears whole or not at all (S3 has no partial PUT: a multipart upload becomes visible when it is
completed), so uploading a ``.pth`` is atomic without a rename. An upload cut off by a dead server may leave
invisible parts behind that AWS still bills; a bucket lifecycle rule ``AbortIncompleteMultipartUpload`` removes them.

A listing never reports "nothing there" because it failed: any error raises, so a resume can never silently
start at iteration 0 because the bucket could not be read.

**Checkpoint layout** (the same names as local checkpoints, see ``fastgen.checkpoint.checkpointer``): under a prefix,
``{iteration:07d}.pth`` is either the whole (monolithic) checkpoint or, next to a DCP folder ``{iteration:07d}.dcp/``,
the marker written after every rank finished. A checkpoint is valid when its ``.pth`` object exists; a folder
without its marker is an incomplete save. ``scan_checkpoints`` / ``newest_valid_checkpoint`` list one level under
the prefix; ``delete_checkpoint`` removes the marker first, then the folder, so an interrupted delete never leaves
a marker that points at a half-deleted folder.

**DCP on S3** (``S3StorageWriter`` / ``S3StorageReader`` for ``torch.distributed.checkpoint.save`` / ``load``).
Design: stage locally, transfer whole files. The writer *is* a ``FileSystemWriter`` whose folder is a private
temporary staging folder on each rank: DCP's own planning and serialisation write the rank's ``__{rank}_{n}.distcp``
files there; ``write_data`` then uploads them to ``<location>/`` (multipart, retried) and deletes the staged copies.
The coordinator's ``finish`` writes ``.metadata`` the same way and uploads it **last**, after DCP has gathered every
rank's write results, so an object store holding ``.metadata`` holds every shard it names. The reader downloads
``.metadata`` and reads it with the project's one unpickler (``fastgen.utils.safe_pickle``: a tampered bucket must
not run code), then, per ``read_data``, downloads exactly the ``.distcp`` files the rank's load
plan reads from, lets ``FileSystemReader`` read them, and deletes them. Costs: each rank needs local disk for its
own shard files while saving and for the files it reads while loading (``staging_dir``, default the system
temporary folder); there is no byte-range streaming. Because the writer inherits ``FileSystemWriter``'s staging
(``BlockingAsyncStager``), ``dcp.async_save`` works with it unchanged: the upload runs on DCP's background thread.
An error on any rank is raised by DCP on every rank as a ``CheckpointException``; ``s3_error_in`` finds our one-line
error inside it.

**Logs.** Library records name locations and endpoints only. botocore's own DEBUG records carry request headers
(the access key id, a session token), so its loggers are capped at WARNING when the first client is made, unless
their level was set explicitly.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastgen.utils.env import credential_source, read_s3_json
from fastgen.utils.errors import CheckpointError, UsageError
from fastgen.utils.io import atomic_open
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)

SCHEME = "s3://"
METADATA_NAME = ".metadata"  # DCP's metadata file (torch.distributed.checkpoint.filesystem._metadata_fn)
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_MARKER = re.compile(r"^(\d{7,})\.pth$")
_FOLDER = re.compile(r"^(\d{7,})\.dcp$")
MiB = 1 << 20


# --------------------------------------------------------------------------------------------------- errors
class S3StorageError(CheckpointError):
    """An S3 operation failed; the message is one line and holds no secret."""


class S3AccessError(S3StorageError):
    """The endpoint rejected the credentials or denied access."""


class S3UnreachableError(S3StorageError):
    """The endpoint did not answer, after botocore's retries."""


class S3NotFoundError(S3StorageError):
    """The bucket or object does not exist."""


# ------------------------------------------------------------------------------------------------ locations
def is_s3_url(text: str | os.PathLike[str]) -> bool:
    """Whether ``text`` is an ``s3://`` URL (as opposed to a local path)."""
    return isinstance(text, str) and text.startswith(SCHEME)


@dataclass(frozen=True)
class S3Location:
    """A bucket and a key (no leading or trailing slash; ``""`` is the bucket's root)."""

    bucket: str
    key: str = ""

    def __post_init__(self) -> None:
        if not _BUCKET.match(self.bucket) or ".." in self.bucket:
            raise UsageError(f"{self.bucket!r} is not a valid S3 bucket name (3-63 lowercase letters, digits, '.', '-')")
        if self.key:
            parts = self.key.split("/")
            if any(part in ("", ".", "..") for part in parts):
                raise UsageError(f"S3 key {self.key!r} has an empty, '.' or '..' segment (in s3://{self.bucket}/{self.key})")

    @classmethod
    def parse(cls, url: str) -> S3Location:
        """``s3://bucket/prefix/...`` -> location; one-line ``UsageError`` for anything else."""
        if not isinstance(url, str) or not url.startswith(SCHEME):
            raise UsageError(f"{url!r} is not an S3 URL: expected s3://bucket/prefix")
        bucket, _, key = url[len(SCHEME):].partition("/")
        if not bucket:
            raise UsageError(f"{url!r} names no bucket: expected s3://bucket/prefix")
        return cls(bucket, key.strip("/"))

    @classmethod
    def from_container(cls, container: str) -> S3Location:
        """The config's ``s3_container`` (``bucket`` or ``bucket/prefix``; an ``s3://`` URL is accepted too)."""
        if not isinstance(container, str) or not container.strip():
            raise UsageError("trainer.checkpointer.s3_container is empty: set it to bucket/prefix (use_s3=True needs it)")
        container = container.strip()
        if container.startswith(SCHEME):
            return cls.parse(container)
        if "://" in container:
            raise UsageError(f"trainer.checkpointer.s3_container={container!r}: expected bucket/prefix or s3://bucket/prefix")
        return cls.parse(SCHEME + container.lstrip("/"))

    def child(self, *parts: str) -> S3Location:
        """The location ``parts`` below this one (``child("0000100", ".metadata")``)."""
        names = [p.strip("/") for p in parts if p.strip("/")]
        return S3Location(self.bucket, "/".join([self.key, *names] if self.key else names))

    @property
    def folder_prefix(self) -> str:
        """The key prefix of everything *below* this location (``key/``, or ``""`` at the bucket's root)."""
        return f"{self.key}/" if self.key else ""

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def url(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.key}" if self.key else f"{SCHEME}{self.bucket}"

    def __str__(self) -> str:
        return self.url


def as_location(location: S3Location | str) -> S3Location:
    return location if isinstance(location, S3Location) else S3Location.parse(str(location))


# ---------------------------------------------------------------------------------------------- credentials
@dataclass(frozen=True)
class S3Credentials:
    """What the boto3 client is built from. Secret fields never appear in ``repr``; ``source`` says where the keys
    came from, for messages."""

    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    region_name: str | None = None
    endpoint_url: str | None = None
    source: str = "boto3's default credential chain (AWS_PROFILE, ~/.aws/credentials, instance role)"

    @property
    def secrets(self) -> tuple[str, ...]:
        """The secret values (for tests that check none of them leaked)."""
        return tuple(v for v in (self.access_key_id, self.secret_access_key, self.session_token) if v)


def resolve_credentials(credentials_dir: str | os.PathLike[str] | None = None,
                        environ: Mapping[str, str] | None = None) -> S3Credentials:
    """The S3 credentials to use: ``credentials_dir/s3.json`` first, then the environment (see the module doc)."""
    env = os.environ if environ is None else environ
    path = Path(credentials_dir).expanduser() / "s3.json" if credentials_dir is not None else None
    data = read_s3_json(path) if path is not None else {}

    def pick(key: str, *variables: str) -> str | None:
        if data.get(key):
            return data[key]
        return next((env[v].strip() for v in variables if env.get(v, "").strip()), None)

    region = pick("region_name", "AWS_REGION", "AWS_DEFAULT_REGION")
    endpoint = pick("endpoint_url", "AWS_ENDPOINT_URL")
    if "aws_access_key_id" in data:
        keys = (data["aws_access_key_id"], data.get("aws_secret_access_key"), data.get("aws_session_token"))
        source, missing = str(path), "aws_secret_access_key"
    elif env.get("AWS_ACCESS_KEY_ID", "").strip():
        keys = tuple(env.get(v, "").strip() or None
                     for v in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"))
        exported = credential_source("AWS_ACCESS_KEY_ID") if environ is None else None
        source = exported or "the environment (AWS_ACCESS_KEY_ID)"
        missing = "AWS_SECRET_ACCESS_KEY"
    else:
        return S3Credentials(region_name=region, endpoint_url=endpoint)
    if not keys[1]:
        raise UsageError(f"S3 credentials from {source} have an access key id but no secret: set {missing}")
    return S3Credentials(*keys, region_name=region, endpoint_url=endpoint, source=source)


def credentials_source(credentials_dir: str | os.PathLike[str] | None = None) -> str:
    """Where the S3 keys would come from (a file path, "the environment (...)" or boto3's chain); never a value."""
    return resolve_credentials(credentials_dir).source


# ----------------------------------------------------------------------------------------------- the client
@dataclass(frozen=True)
class S3Settings:
    """Retries, timeouts and multipart sizes of the client (botocore / boto3 ``TransferConfig``)."""

    max_attempts: int = 8  # every try of a request, the first included; full-jitter backoff, at most 20 s a wait
    retry_mode: str = "standard"  # or "adaptive" (client-side rate limiting on throttling)
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0
    multipart_threshold: int = 64 * MiB
    multipart_chunksize: int = 64 * MiB
    max_concurrency: int = 4
    list_page_size: int = 1000  # keys per ListObjectsV2 request (1000 is the S3 maximum)

    def __post_init__(self) -> None:
        if self.retry_mode not in ("standard", "adaptive"):
            raise UsageError(f"S3 retry_mode={self.retry_mode!r}: expected standard or adaptive")
        if self.max_attempts < 1:
            raise UsageError(f"S3 max_attempts={self.max_attempts}: must be at least 1")
        if not 1 <= self.list_page_size <= 1000:
            raise UsageError(f"S3 list_page_size={self.list_page_size}: must be 1-1000")
        if self.multipart_chunksize < 5 * MiB:
            raise UsageError("S3 multipart_chunksize must be at least 5 MiB (the S3 minimum part size)")


_DENIED = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken", "ExpiredToken",
           "InvalidClientTokenId", "UnrecognizedClientException", "AuthorizationHeaderMalformed", "403", "Forbidden"}
_MISSING = {"NoSuchBucket", "NoSuchKey", "404", "NotFound"}


class S3Storage:
    """A lazily created, retrying boto3 S3 client with one-line errors. Thread-safe (boto3 clients are)."""

    def __init__(self, credentials: S3Credentials | None = None, settings: S3Settings | None = None) -> None:
        self.credentials = credentials or resolve_credentials()
        self.settings = settings or S3Settings()
        self._client: Any = None
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, credentials_dir: str | os.PathLike[str] | None, settings: S3Settings | None = None) -> S3Storage:
        return cls(resolve_credentials(credentials_dir), settings)

    def __repr__(self) -> str:
        return f"S3Storage(endpoint={self.endpoint}, credentials from {self.credentials.source})"

    def __getstate__(self) -> dict[str, Any]:  # a client and a lock do not pickle (DCP's async process executor)
        return {"credentials": self.credentials, "settings": self.settings}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["credentials"], state["settings"])

    @property
    def endpoint(self) -> str:
        """The endpoint for messages: the configured URL, or AWS's regional one."""
        return self.credentials.endpoint_url or f"AWS S3 ({self.credentials.region_name or 'default region'})"

    @property
    def client(self) -> Any:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._make_client()
        return self._client

    def _make_client(self) -> Any:
        import boto3
        from botocore.config import Config

        _quiet_boto_loggers()
        c, s = self.credentials, self.settings
        options: dict[str, Any] = {}
        if "request_checksum_calculation" in Config.OPTION_DEFAULTS:
            # boto3 >= 1.36 adds CRC checksums to every upload, which S3 lookalikes may reject; only when required
            options.update(request_checksum_calculation="when_required", response_checksum_validation="when_required")
        # botocore's "max_attempts" counts retries only; "total_max_attempts" counts the first try too
        config = Config(retries={"mode": s.retry_mode, "total_max_attempts": s.max_attempts},
                        connect_timeout=s.connect_timeout_s, read_timeout=s.read_timeout_s,
                        s3={"addressing_style": "path"} if c.endpoint_url else {}, **options)
        session = boto3.session.Session()  # a session per client: boto3's default session is not thread-safe
        # SigV4 signs with a region; S3 lookalikes accept any, so an endpoint without a region gets us-east-1
        region = c.region_name or ("us-east-1" if c.endpoint_url else None)
        return session.client("s3", aws_access_key_id=c.access_key_id, aws_secret_access_key=c.secret_access_key,
                              aws_session_token=c.session_token, region_name=region, endpoint_url=c.endpoint_url,
                              config=config)

    def _transfer_config(self) -> Any:
        from boto3.s3.transfer import TransferConfig

        s = self.settings
        return TransferConfig(multipart_threshold=s.multipart_threshold, multipart_chunksize=s.multipart_chunksize,
                              max_concurrency=s.max_concurrency, use_threads=s.max_concurrency > 1)

    # --------------------------------------------------------------------------------------- error mapping
    @contextlib.contextmanager
    def _errors(self, action: str, location: S3Location, missing: str | None = None) -> Iterator[None]:
        """Turn a boto error inside the block into a one-line ``S3StorageError`` (``missing``: what a 404 means)."""
        try:
            yield
        except S3StorageError:
            raise
        except Exception as exc:  # noqa: BLE001 - only boto errors are translated, the rest re-raised below
            error = self._translate(exc, action, location, missing)
            if error is None:
                raise
            raise error from None

    def _translate(self, exc: BaseException, action: str, location: S3Location,
                   missing: str | None = None) -> S3StorageError | None:
        from botocore import exceptions as bex

        where = f"while {action} {location}"
        for cause in _exception_chain(exc):
            if isinstance(cause, bex.ClientError):
                error = cause.response.get("Error", {})
                code = str(error.get("Code") or cause.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?"))
                if code in _DENIED:
                    return S3AccessError(f"S3 credentials from {self.credentials.source} were rejected by "
                                         f"{self.endpoint} ({code}) {where}: check the key pair and its "
                                         f"permissions on bucket {location.bucket}")
                if code in _MISSING:
                    what = f"bucket {location.bucket}" if code == "NoSuchBucket" else (missing or str(location))
                    return S3NotFoundError(f"{what} does not exist at {self.endpoint} ({code}) {where}")
                message = str(error.get("Message") or "").replace("\n", " ")[:200]
                return S3StorageError(f"S3 request failed at {self.endpoint} ({code}{': ' + message if message else ''}) {where}")
            if isinstance(cause, (bex.ConnectionError, bex.HTTPClientError)):
                return S3UnreachableError(
                    f"S3 endpoint {self.endpoint} did not answer {where} ({type(cause).__name__}, retried with "
                    f"backoff up to {self.settings.max_attempts} attempts): check that the server is up and reachable")
            if isinstance(cause, (bex.NoCredentialsError, bex.PartialCredentialsError)):
                return S3AccessError(f"no S3 credentials found {where}: set credentials_dir/s3.json "
                                     "(aws_access_key_id, aws_secret_access_key) or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY")
            if isinstance(cause, bex.BotoCoreError):
                return S3StorageError(f"S3 client error {where} ({type(cause).__name__})")
        return None

    # ------------------------------------------------------------------------------------------ operations
    def upload_file(self, path: str | os.PathLike[str], location: S3Location | str) -> None:
        """Upload a local file (multipart above ``multipart_threshold``); the object appears whole or not at all."""
        location = as_location(location)
        logger.debug("uploading %s to %s", path, location)
        with self._errors("uploading to", location):
            self.client.upload_file(os.fspath(path), location.bucket, location.key, Config=self._transfer_config())

    def upload_bytes(self, data: bytes, location: S3Location | str) -> None:
        """Upload ``data`` as one object (multipart when large)."""
        location = as_location(location)
        with self._errors("uploading to", location):
            self.client.upload_fileobj(io.BytesIO(data), location.bucket, location.key, Config=self._transfer_config())

    def download_file(self, location: S3Location | str, path: str | os.PathLike[str]) -> Path:
        """Download an object to ``path`` atomically (a temporary name, fsynced, then renamed)."""
        location, path = as_location(location), Path(path)
        logger.debug("downloading %s to %s", location, path)
        with self._errors("downloading", location), atomic_open(path, "wb") as handle:
            self.client.download_fileobj(location.bucket, location.key, handle, Config=self._transfer_config())
        return path

    def read_bytes(self, location: S3Location | str) -> bytes:
        """An object's content."""
        location = as_location(location)
        with self._errors("reading", location):
            return self.client.get_object(Bucket=location.bucket, Key=location.key)["Body"].read()

    def exists(self, location: S3Location | str) -> bool:
        """Whether the object exists (a missing bucket, rejected credentials or no answer raise)."""
        from botocore.exceptions import ClientError

        location = as_location(location)
        with self._errors("checking", location):
            try:
                self.client.head_object(Bucket=location.bucket, Key=location.key)
                return True
            except ClientError as exc:
                if str(exc.response.get("Error", {}).get("Code")) not in ("404", "NoSuchKey", "NotFound"):
                    raise
        self.check_bucket(location)  # HEAD on a key of a missing bucket is a plain 404 too
        return False

    def check_bucket(self, location: S3Location | str) -> None:
        """Raise ``S3NotFoundError`` / ``S3AccessError`` / ``S3UnreachableError`` unless the bucket is usable."""
        location = as_location(location)
        with self._errors("opening the bucket of", location, missing=f"bucket {location.bucket}"):
            self.client.head_bucket(Bucket=location.bucket)

    def list_keys(self, location: S3Location | str) -> list[str]:
        """Every key below ``location/`` (all levels, every page), sorted. Raises on any error, never returns a
        partial or empty listing because a request failed."""
        location = as_location(location)
        keys: list[str] = []
        with self._errors("listing", location):
            for page in self._pages(location.bucket, location.folder_prefix):
                keys.extend(item["Key"] for item in page.get("Contents", ()))
        return sorted(keys)

    def object_sizes(self, location: S3Location | str) -> dict[str, int]:
        """``{object name: size in bytes}`` directly below ``location/`` (one level, every page)."""
        location = as_location(location)
        prefix = location.folder_prefix
        sizes: dict[str, int] = {}
        with self._errors("listing", location):
            for page in self._pages(location.bucket, prefix, Delimiter="/"):
                sizes.update((item["Key"][len(prefix):], int(item["Size"])) for item in page.get("Contents", ()))
        return {name: size for name, size in sizes.items() if name}

    def list_children(self, location: S3Location | str) -> tuple[list[str], list[str]]:
        """``(object names, folder names)`` directly below ``location/`` (one level, every page), sorted."""
        location = as_location(location)
        prefix = location.folder_prefix
        objects: list[str] = []
        folders: list[str] = []
        with self._errors("listing", location):
            for page in self._pages(location.bucket, prefix, Delimiter="/"):
                objects.extend(item["Key"][len(prefix):] for item in page.get("Contents", ()))
                folders.extend(item["Prefix"][len(prefix):].rstrip("/") for item in page.get("CommonPrefixes", ()))
        return sorted(o for o in objects if o), sorted(folders)

    def _pages(self, bucket: str, prefix: str, **kwargs: str) -> Iterator[dict[str, Any]]:
        paginator = self.client.get_paginator("list_objects_v2")
        yield from paginator.paginate(Bucket=bucket, Prefix=prefix,
                                      PaginationConfig={"PageSize": self.settings.list_page_size}, **kwargs)

    def delete(self, location: S3Location | str) -> None:
        """Delete one object (no error when it is already gone)."""
        location = as_location(location)
        with self._errors("deleting", location):
            self.client.delete_object(Bucket=location.bucket, Key=location.key)

    def delete_folder(self, location: S3Location | str) -> int:
        """Delete every object below ``location/`` (never a sibling that merely shares the prefix); return the
        count. Raises if any object could not be deleted."""
        location = as_location(location)
        keys = self.list_keys(location)
        with self._errors("deleting", location):
            for start in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000 keys
                batch = [{"Key": key} for key in keys[start:start + 1000]]
                response = self.client.delete_objects(Bucket=location.bucket, Delete={"Objects": batch, "Quiet": True})
                if response.get("Errors"):
                    first = response["Errors"][0]
                    raise S3StorageError(f"could not delete {len(response['Errors'])} objects below {location} "
                                         f"(first: {first.get('Key')}: {first.get('Code')})")
        return len(keys)


_BOTO_LOGGERS = ("botocore", "boto3", "s3transfer", "urllib3")


def _quiet_boto_loggers() -> None:
    """botocore's DEBUG records carry request headers - the access key id in ``Authorization``, the session token
    in ``X-Amz-Security-Token``. A root logger at DEBUG (a script's ``basicConfig``) must not put them in a log, so
    these loggers are capped at WARNING unless someone set their level on purpose."""
    for name in _BOTO_LOGGERS:
        boto_logger = logging.getLogger(name)
        if boto_logger.level == logging.NOTSET:
            boto_logger.setLevel(logging.WARNING)


def _exception_chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def s3_error_in(exc: BaseException) -> S3StorageError | None:
    """The ``S3StorageError`` behind ``exc``: itself, its cause, or one rank's failure inside DCP's
    ``CheckpointException`` (which DCP raises on every rank when any rank's write or read failed)."""
    for cause in _exception_chain(exc):
        if isinstance(cause, S3StorageError):
            return cause
        for failure in (getattr(cause, "failures", None) or {}).values():
            inner = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(inner, BaseException) and (found := s3_error_in(inner)) is not None:
                return found
    return None


# ------------------------------------------------------------------------------------------- checkpoints
def checkpoint_marker(location: S3Location, iteration: int) -> S3Location:
    """``<location>/{iteration:07d}.pth``: the monolithic checkpoint, or the marker of a sharded one."""
    return location.child(f"{iteration:07d}.pth")


def checkpoint_folder(location: S3Location, iteration: int) -> S3Location:
    """``<location>/{iteration:07d}.dcp``: the DCP folder of a sharded checkpoint (named as on local disk)."""
    return location.child(f"{iteration:07d}.dcp")


@dataclass(frozen=True)
class S3Checkpoint:
    """A valid checkpoint: its ``.pth`` object exists; ``folder`` is its DCP folder when it is sharded."""

    iteration: int
    marker: S3Location
    folder: S3Location | None


@dataclass(frozen=True)
class CheckpointScan:
    """One listing of a checkpoints prefix: the valid checkpoints (oldest first) and the iterations of DCP folders
    without a marker (incomplete saves, safe to delete unless a save is writing them now)."""

    valid: list[S3Checkpoint]
    unmarked: list[int]


def scan_checkpoints(storage: S3Storage, location: S3Location | str) -> CheckpointScan:
    """List ``location`` one level deep and sort its checkpoints out. Raises on any listing error, including a
    missing bucket; an existing bucket with nothing under the prefix is an empty scan."""
    location = as_location(location)
    storage.check_bucket(location)
    objects, folders = storage.list_children(location)
    markers = {int(m.group(1)) for m in map(_MARKER.match, objects) if m}
    dcp_folders = {int(m.group(1)) for m in map(_FOLDER.match, folders) if m}
    valid = [S3Checkpoint(it, checkpoint_marker(location, it),
                          checkpoint_folder(location, it) if it in dcp_folders else None) for it in sorted(markers)]
    return CheckpointScan(valid, sorted(dcp_folders - markers))


def newest_valid_checkpoint(storage: S3Storage, location: S3Location | str) -> S3Checkpoint | None:
    """The checkpoint with the highest iteration whose ``.pth`` exists, or None when there is none (a listing
    error raises instead)."""
    valid = scan_checkpoints(storage, location).valid
    return valid[-1] if valid else None


def delete_checkpoint(storage: S3Storage, location: S3Location | str, iteration: int) -> None:
    """Delete checkpoint ``iteration``: the marker first (it stops being valid at once), then its DCP folder."""
    location = as_location(location)
    storage.delete(checkpoint_marker(location, iteration))
    storage.delete_folder(checkpoint_folder(location, iteration))


# -------------------------------------------------------------------------------------------- DCP storage
def _staging_folder(root: str | None) -> str:
    """A new private folder for one save's or load's files (under ``root``, default the system temp folder)."""
    if root is not None:
        Path(root).mkdir(parents=True, exist_ok=True)
    return tempfile.mkdtemp(prefix="fastgen-dcp-", dir=root)


def _dcp_storage_classes() -> dict[str, type]:
    """Build the DCP writer and reader (torch.distributed.checkpoint is imported only when they are first used)."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter

    class _S3Staged:
        """What the writer and the reader share: the S3 location (DCP's ``checkpoint_id``), the client, and a private
        local staging folder that is DCP's ``path``, replaced by a fresh one on every ``reset``."""

        path: Any

        def _set_up(self, location: S3Location | str, storage: S3Storage,
                    staging_dir: str | os.PathLike[str] | None) -> str:
            self.location = as_location(location)
            self.storage = storage
            self.staging_root = None if staging_dir is None else os.fspath(staging_dir)
            return _staging_folder(self.staging_root)

        def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
            if checkpoint_id:
                self.location = as_location(str(checkpoint_id))
            shutil.rmtree(self.path, ignore_errors=True)
            super().reset(_staging_folder(self.staging_root))  # type: ignore[misc]

        @property
        def checkpoint_id(self) -> str:
            return self.location.url

        @classmethod
        def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
            return is_s3_url(checkpoint_id)

    class S3StorageWriter(_S3Staged, FileSystemWriter):
        """``torch.distributed.checkpoint`` writer to ``s3://bucket/prefix/`` through a local staging folder (see the
        module docstring). ``dcp.save(state, storage_writer=S3StorageWriter(location, storage))``."""

        def __init__(self, location: S3Location | str, storage: S3Storage, staging_dir: str | os.PathLike[str] | None = None,
                     thread_count: int = 1, overwrite: bool = True, **kwargs: Any) -> None:
            staging = self._set_up(location, storage, staging_dir)
            # sync_files: the staged files are uploaded and deleted, never the durable copy; fsync would only cost time.
            FileSystemWriter.__init__(self, staging, single_file_per_rank=True, sync_files=False,
                                      thread_count=thread_count, overwrite=overwrite, **kwargs)

        def prepare_local_plan(self, plan: Any) -> Any:
            plan = super().prepare_local_plan(plan)
            if not self.overwrite and self.storage.exists(self.location.child(METADATA_NAME)):
                raise S3StorageError(f"a DCP checkpoint already exists at {self.location} and overwrite=False")
            return plan

        def write_data(self, plan: Any, planner: Any) -> Any:
            try:
                future = super().write_data(plan, planner)
                future.wait()
                self._upload_staged(lambda name: not name.endswith(METADATA_NAME))
                return future
            finally:
                shutil.rmtree(self.path, ignore_errors=True)

        def finish(self, metadata: Any, results: Any) -> None:
            try:
                Path(self.path).mkdir(parents=True, exist_ok=True)
                super().finish(metadata, results)
                self._upload_staged(lambda name: name.endswith(METADATA_NAME))  # the metadata object, last
            finally:
                shutil.rmtree(self.path, ignore_errors=True)

        def _upload_staged(self, select: Any) -> None:
            for file in sorted(Path(self.path).iterdir()):
                if file.is_file() and not file.name.endswith(".tmp") and select(file.name):
                    self.storage.upload_file(file, self.location.child(file.name))
                    file.unlink()

    from fastgen.checkpoint.dcp_safe import SafeDcpReading

    class S3StorageReader(SafeDcpReading, _S3Staged, FileSystemReader):
        """``torch.distributed.checkpoint`` reader of ``s3://bucket/prefix/`` that downloads only the files its load
        plan reads. ``dcp.load(state, storage_reader=S3StorageReader(location, storage))``."""

        def __init__(self, location: S3Location | str, storage: S3Storage,
                     staging_dir: str | os.PathLike[str] | None = None) -> None:
            FileSystemReader.__init__(self, self._set_up(location, storage, staging_dir))

        def _metadata_stream(self, rank: int | None) -> Any:
            name = Path(self._get_metadata_path(rank)).name
            stream = io.BytesIO(self.storage.read_bytes(self.location.child(name)))
            stream.name = self.location.child(name).url  # type: ignore[attr-defined] - names it in errors
            return stream

        def _file_sizes(self) -> dict[str, int]:
            return self.storage.object_sizes(self.location)

        def read_data(self, plan: Any, planner: Any) -> Any:
            names = sorted({self.storage_data[item.storage_index].relative_path for item in plan.items})
            try:
                for name in names:
                    self.storage.download_file(self.location.child(name), Path(self.path, name))
                return super().read_data(plan, planner)
            finally:
                shutil.rmtree(self.path, ignore_errors=True)

    for cls in (S3StorageWriter, S3StorageReader):
        cls.__qualname__ = cls.__name__  # pickles by reference, found again through the module's __getattr__
    return {"S3StorageWriter": S3StorageWriter, "S3StorageReader": S3StorageReader}


_LAZY: dict[str, type] = {}


def __getattr__(name: str) -> Any:
    """``S3StorageWriter`` / ``S3StorageReader`` on first access (PEP 562), so importing this module stays light."""
    if name in ("S3StorageWriter", "S3StorageReader"):
        if not _LAZY:
            _LAZY.update(_dcp_storage_classes())
        return _LAZY[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CheckpointScan", "S3AccessError", "S3Checkpoint", "S3Credentials", "S3Location", "S3NotFoundError",
    "S3Settings", "S3Storage", "S3StorageError", "S3StorageReader", "S3StorageWriter", "S3UnreachableError",
    "as_location", "checkpoint_folder", "checkpoint_marker", "credentials_source",
    "delete_checkpoint", "is_s3_url", "newest_valid_checkpoint", "resolve_credentials", "s3_error_in",
    "scan_checkpoints",
]

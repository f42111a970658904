"""VLMLogger: scores generated media with a vision-language model judge behind an OpenAI-compatible endpoint.

Endpoint: ``POST <base_url>/chat/completions`` (``base_url`` argument, else ``VLM_BASE_URL``, which
``credentials_dir/VLM_BASE_URL.txt`` can also set), ``Authorization: Bearer <key>`` with the key from
``OPENAI_API_KEY`` (or ``credentials_dir/openai_api.txt``; without a key no header is sent, for local servers).
The key is read from the environment when training starts, kept in memory only, and never logged.

Each judged sample is one request whose user message holds the prompt text and the media inline as PNG data
URLs - ``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`` - one image for an
image sample, ``num_frames`` uniformly spaced frames (first and last included) for a video. The reply's first
choice is parsed for a score (``parse_score``: ``{"score": 7}``, ``Score: 7/10``, ``7.5``, ``7 out of 10``),
rescaled when the reply names a different maximum (``a/b -> score_min + (score_max - score_min) a / b``) and
clamped to ``[score_min, score_max]``; a reply without a score counts as a failure.

Training never waits for the judge: ``process`` only queues jobs (bounded by ``queue_size``; when full the
oldest queued job is dropped and counted) for one background thread, which encodes the media, sends the
request with a ``timeout_s`` socket timeout and retries up to ``max_retries`` times with exponential backoff
``backoff_s * 2^attempt`` (or the server's ``Retry-After``, at most 60 s) on timeouts, connection errors, HTTP
5xx and 429 - never on other 4xx. Results that finished since the last call come back from the next
``process`` (or from ``close``, which drains the queue for at most ``drain_timeout_s`` at the end of training;
what is still queued then is counted as dropped).

Logged (as ``vlm/<key>`` with the preset's module name ``vlm``; window means, like the training losses):

* ``score_mean`` - mean score of the requests that finished since the last report;
* ``scored`` - how many requests finished with a score since the last report;
* ``latency_s`` - their mean latency, first attempt to the parsed reply (retries and backoff included);
* ``failures`` - requests that failed so far (HTTP errors, exhausted retries, unparsable replies);
* ``dropped`` - jobs dropped so far because the queue was full or the drain deadline passed;
* ``pending`` - jobs queued or in flight at the time of the report.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass
from http.client import HTTPException
from typing import Any, Literal

from fastgen.callbacks.log_modules.base import LogModule, MediaEntry
from fastgen.utils.errors import ConfigError
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)

DEFAULT_PROMPT = (
    "You are judging the visual quality of a sample from a generative model. {subject} "
    "Rate its realism, sharpness and coherence on a scale from {score_min:g} (worst) to {score_max:g} (best). "
    'Answer with JSON only: {{"score": <number>}}.'
)

_NUMBER = r"[-+]?\d+(?:\.\d+)?"
_JSON_OBJECT = re.compile(r"\{[^{}]*\}")
_LABELLED = re.compile(rf"\b(?:score|rating)\b\s*(?:is|of)?\s*[:=]?\s*\**\s*({_NUMBER})(?:\s*(?:/|out of)\s*({_NUMBER}))?",
                       re.IGNORECASE)
_FRACTION = re.compile(rf"({_NUMBER})\s*(?:/|out of)\s*({_NUMBER})", re.IGNORECASE)
_BARE = re.compile(rf"^\s*\**\s*({_NUMBER})\s*\**\s*\.?\s*$")


def _scaled(value: float, denominator: float | None, score_min: float, score_max: float) -> float:
    if denominator is not None and denominator > 0 and denominator != score_max:
        value = score_min + (score_max - score_min) * value / denominator
    return value


def parse_score(text: str, score_min: float = 0.0, score_max: float = 10.0) -> float | None:
    """The score in a judge's reply, clamped to ``[score_min, score_max]``; ``None`` when there is none.

    Tried in order: a JSON object with ``score`` (or ``rating``); ``Score: 7``, ``score = 7/10``,
    ``Rating: 3 out of 5``; a fraction ``7/10`` or ``7 out of 10`` anywhere; a reply that is only a number.
    A fraction whose denominator differs from ``score_max`` is rescaled to the range.
    """
    if not isinstance(text, str) or not text.strip():
        return None
    value: float | None = None
    denominator: float | None = None
    for match in _JSON_OBJECT.finditer(text):
        try:
            obj = json.loads(match.group(0))
        except ValueError:
            continue
        if isinstance(obj, dict):
            raw = obj.get("score", obj.get("rating"))
            if isinstance(raw, (int, float)) and not isinstance(raw, bool):
                value = float(raw)
            elif isinstance(raw, str):
                value = parse_score(raw, score_min, score_max)
                if value is not None:
                    return value
            if value is not None:
                break
    if value is None:
        for pattern in (_LABELLED, _FRACTION, _BARE):
            match = pattern.search(text)
            if match:
                value = float(match.group(1))
                groups = match.groups()
                denominator = float(groups[1]) if len(groups) > 1 and groups[1] is not None else None
                break
    if value is None or not math.isfinite(value):
        return None
    value = _scaled(value, denominator, score_min, score_max)
    return min(max(value, score_min), score_max)


class _RetryableError(Exception):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class _FatalError(Exception):
    pass


@dataclass
class _Job:
    entry: MediaEntry
    iteration: int


class VLMLogger(LogModule):
    def __init__(self, media: Literal["auto", "image", "video"] = "auto", base_url: str | None = None,
                 model: str = "gpt-4o-mini", prompt: str = DEFAULT_PROMPT, num_frames: int = 4,
                 max_entries_per_step: int = 4, image_size: int = 256, score_min: float = 0.0,
                 score_max: float = 10.0, timeout_s: float = 30.0, max_retries: int = 3, backoff_s: float = 0.5,
                 queue_size: int = 16, drain_timeout_s: float = 60.0, max_tokens: int = 64,
                 temperature: float = 0.0, api_key_env: str = "OPENAI_API_KEY") -> None:
        if media not in ("auto", "image", "video"):
            raise ValueError(f"media must be 'auto', 'image' or 'video'; got {media!r}")
        if not score_max > score_min:
            raise ValueError(f"score_max ({score_max}) must be greater than score_min ({score_min})")
        if queue_size < 1 or num_frames < 1 or max_retries < 0:
            raise ValueError("queue_size and num_frames must be >= 1 and max_retries >= 0")
        self.media = media
        self.base_url = base_url
        self.model = model
        self.prompt = prompt
        self.num_frames = int(num_frames)
        self.max_entries_per_step = int(max_entries_per_step)
        self.image_size = int(image_size)
        self.score_min, self.score_max = float(score_min), float(score_max)
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.queue_size = int(queue_size)
        self.drain_timeout_s = float(drain_timeout_s)
        self.max_tokens = int(max_tokens)
        self.temperature = float(temperature)
        self.api_key_env = api_key_env
        self.endpoint: str | None = None
        self._api_key: str | None = None
        self._cond = threading.Condition()
        self._queue: deque[_Job] = deque()
        self._inflight = 0
        self._closing = False
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        self._scores: list[tuple[float, float]] = []  # (score, latency) since the last report
        self._errors: list[str] = []  # failure messages since the last report
        self.failures = 0
        self.dropped = 0
        self._reported = (0, 0)
        self._warned_kinds: set[str] = set()

    def __repr__(self) -> str:  # never show the key
        return f"VLMLogger(model={self.model!r}, endpoint={self.endpoint or self.base_url!r}, media={self.media!r})"

    # ---- lifecycle -----------------------------------------------------------------------------------------
    def setup(self, run_dir: Any, is_rank0: bool) -> None:
        super().setup(run_dir, is_rank0)
        base = (self.base_url or os.environ.get("VLM_BASE_URL", "")).strip()
        if not base:
            raise ConfigError(
                "VLMLogger needs the judge's OpenAI-compatible endpoint: set VLM_BASE_URL (or put it in "
                "credentials_dir/VLM_BASE_URL.txt) or pass log_modules.<name>.base_url"
            )
        base = base.rstrip("/")
        self.endpoint = base if base.endswith("/chat/completions") else base + "/chat/completions"
        self._api_key = os.environ.get(self.api_key_env) or None
        if is_rank0 and self._api_key is None:
            logger.info("VLMLogger: %s is not set; sending judge requests without an Authorization header",
                        self.api_key_env)

    def process(self, entries: list[MediaEntry], iteration: int) -> dict[str, Any] | None:
        kinds = {"auto": ("image", "video"), "image": ("image",), "video": ("video",)}[self.media]
        selected = [e for e in entries if e.kind in kinds][: max(self.max_entries_per_step, 0)]
        if entries and not selected and entries[0].kind not in self._warned_kinds:
            self._warned_kinds.add(entries[0].kind)
            logger.warning("VLMLogger(media=%r) has nothing to judge in %s samples", self.media, entries[0].kind)
        for entry in selected:
            self.submit(_Job(entry, iteration))
        return self.report()

    def close(self, timeout_s: float | None = None) -> dict[str, Any] | None:
        """Wait (at most ``min(timeout_s, drain_timeout_s)``) for queued and in-flight jobs, then report."""
        deadline = time.monotonic() + min(self.drain_timeout_s, timeout_s if timeout_s is not None else math.inf)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            while (self._queue or self._inflight) and self._thread is not None and self._thread.is_alive():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(timeout=left)
            if self._queue:
                self.dropped += len(self._queue)
                self._queue.clear()
            self._cancel.set()  # cut short any backoff sleep of a job still in flight
            self._cond.notify_all()
        return self.report()

    # ---- the queue -----------------------------------------------------------------------------------------
    def submit(self, job: _Job) -> None:
        """Queue a job without blocking; drop (and count) the oldest queued job when the queue is full."""
        with self._cond:
            if self._closing:
                self.dropped += 1
                return
            if len(self._queue) >= self.queue_size:
                self._queue.popleft()
                self.dropped += 1
            self._queue.append(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._worker, name="fastgen-vlm-judge", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def pending(self) -> int:
        with self._cond:
            return len(self._queue) + self._inflight

    def report(self) -> dict[str, Any] | None:
        """Scalars for what finished since the last report; ``None`` when nothing changed."""
        with self._cond:
            scores, self._scores = self._scores, []
            errors, self._errors = self._errors, []
            counters = (self.failures, self.dropped)
            pending = len(self._queue) + self._inflight
            if not scores and counters == self._reported:
                return None
            self._reported = counters
        if errors:
            logger.warning("VLM judge: %d request(s) failed since the last report (last: %s)", len(errors), errors[-1])
        loss_dict: dict[str, float] = {"failures": float(counters[0]), "dropped": float(counters[1]),
                                       "pending": float(pending)}
        if scores:
            loss_dict["score_mean"] = sum(s for s, _ in scores) / len(scores)
            loss_dict["latency_s"] = sum(t for _, t in scores) / len(scores)
            loss_dict["scored"] = float(len(scores))
        return {"loss_dict": loss_dict}

    def _worker(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return
                job = self._queue.popleft()
                self._inflight += 1
            start = time.monotonic()
            score, error = None, None
            try:
                score = self._judge(job)
            except Exception as exc:  # noqa: BLE001 - any failure is counted, never raised into training
                error = str(exc) or type(exc).__name__
                if self._api_key:  # a server may echo the request back: the key never reaches a log
                    error = error.replace(self._api_key, "<redacted>")
            latency = time.monotonic() - start
            with self._cond:
                self._inflight -= 1
                if score is None:
                    self.failures += 1
                    self._errors.append(error or "no score")
                else:
                    self._scores.append((score, latency))
                self._cond.notify_all()

    # ---- one request ---------------------------------------------------------------------------------------
    def build_messages(self, entry: MediaEntry) -> list[dict[str, Any]]:
        """The chat messages for one sample: the prompt, then the image or ``num_frames`` video frames."""
        from fastgen.callbacks.log_modules.media import frame_indices, png_data_url, to_pil

        if entry.kind == "video":
            frames = frame_indices(entry.data.shape[1], self.num_frames)
            images = [entry.data[:, t] for t in frames]
            subject = f"These are {len(frames)} frames, uniformly spaced in time, of one generated video."
        else:
            images = [entry.data]
            subject = "This is one generated image."
        if entry.caption:
            subject += f" It was generated for: {entry.caption!r}."
        text = self.prompt.format(subject=subject, score_min=self.score_min, score_max=self.score_max)
        content: list[dict[str, Any]] = [{"type": "text", "text": text}]
        for image in images:
            content.append({"type": "image_url", "image_url": {"url": png_data_url(to_pil(image, self.image_size))}})
        return [{"role": "user", "content": content}]

    def _judge(self, job: _Job) -> float:
        payload = json.dumps({
            "model": self.model,
            "messages": self.build_messages(job.entry),
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
        }).encode()
        attempt = 0
        while True:
            try:
                reply = self._post(payload)
                break
            except _RetryableError as exc:
                if attempt >= self.max_retries or self._cancel.is_set():
                    raise _FatalError(f"{exc} (after {attempt + 1} attempt(s))") from None
                delay = self.backoff_s * 2**attempt
                if exc.retry_after is not None:
                    delay = max(delay, min(exc.retry_after, 60.0))
                attempt += 1
                if self._cancel.wait(delay):
                    raise _FatalError(f"{exc} (gave up at shutdown)") from None
        text = _reply_text(reply)
        score = parse_score(text, self.score_min, self.score_max)
        if score is None:
            raise _FatalError(f"no score in the judge's reply {text[:80]!r}")
        return score

    def _post(self, payload: bytes) -> Any:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        request = urllib.request.Request(self.endpoint or "", data=payload, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310 - configured URL
                body = response.read()
        except urllib.error.HTTPError as exc:
            detail = _error_detail(exc)
            if exc.code == 429 or exc.code >= 500:
                raise _RetryableError(f"HTTP {exc.code}{detail}", _retry_after(exc)) from None
            raise _FatalError(f"HTTP {exc.code}{detail}") from None
        except (TimeoutError, socket.timeout):
            raise _RetryableError(f"timed out after {self.timeout_s:g} s") from None
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, (TimeoutError, socket.timeout)):
                raise _RetryableError(f"timed out after {self.timeout_s:g} s") from None
            raise _RetryableError(f"cannot reach the judge: {reason}") from None
        except (ConnectionError, HTTPException, OSError) as exc:
            raise _RetryableError(f"connection error: {type(exc).__name__}") from None
        try:
            return json.loads(body)
        except ValueError:
            raise _FatalError("the judge's reply is not JSON") from None


def _reply_text(reply: Any) -> str:
    """The text of the first choice of a chat-completions response (string or list-of-parts content)."""
    try:
        content = reply["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise _FatalError("the judge's reply has no choices[0].message.content") from None
    if isinstance(content, list):
        content = " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""


def _error_detail(exc: urllib.error.HTTPError) -> str:
    try:
        body = exc.read(300).decode("utf-8", "replace").strip()
    except Exception:  # noqa: BLE001
        body = ""
    return f": {' '.join(body.split())[:200]}" if body else ""


def _retry_after(exc: urllib.error.HTTPError) -> float | None:
    value = exc.headers.get("Retry-After") if exc.headers is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None

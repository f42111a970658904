"""VLMLogger against a real chat-completions server on 127.0.0.1: request shape, background queue, retries,
timeouts, unparsable replies, the API key's sources, and the score parser."""

from __future__ import annotations

import base64
import io
import threading
from pathlib import Path

import pytest
import torch
from PIL import Image

from fastgen.callbacks.log_modules.base import MediaEntry
from fastgen.callbacks.log_modules.vlm import VLMLogger, parse_score
from fastgen.utils.env import load_credentials
from fastgen.utils.errors import ConfigError
from fastgen_testing import JudgeServer

KEY = "sk-test-0123456789abcdef"


def image_entry(seed: int = 0, caption: str | None = "a red square", size: int = 8) -> MediaEntry:
    g = torch.Generator().manual_seed(seed)
    return MediaEntry(kind="image", data=torch.rand(3, size, size, generator=g) * 2 - 1, iteration=10,
                      caption=caption, index=seed)


def video_entry(frames: int = 9) -> MediaEntry:
    data = torch.linspace(-1, 1, frames).view(1, frames, 1, 1).expand(3, frames, 8, 8).clone()
    return MediaEntry(kind="video", data=data, iteration=10, fps=8.0)


def judge(server: JudgeServer, tmp_path: Path, **kwargs) -> VLMLogger:
    module = VLMLogger(base_url=server.base_url, model="judge-model-1", **kwargs)
    module.setup(tmp_path, is_rank0=True)
    return module


def decode_png(url: str) -> Image.Image:
    assert url.startswith("data:image/png;base64,")
    return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))


def merged(*reports: dict | None) -> dict[str, float]:
    """What successive reports add up to. ``process`` reports whatever finished by the time it returns, so a fast
    judge can be reported there and ``close`` then has nothing new (``None``): counters are running totals (take
    the last), scores are per report (pool them)."""
    shown = [r["loss_dict"] for r in reports if r is not None]
    assert shown, "nothing was reported"
    total = {key: shown[-1][key] for key in ("failures", "dropped", "pending")}
    scored = [(d["score_mean"], d["scored"]) for d in shown if "score_mean" in d]
    if scored:
        total["scored"] = sum(n for _, n in scored)
        total["score_mean"] = sum(s * n for s, n in scored) / total["scored"]
    return total


def test_request_shape_and_scores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with JudgeServer(script=[{"status": 200, "content": "Score: 7/10"}, {"status": 200, "content": "9"}]) as server:
        module = judge(server, tmp_path, image_size=64)
        reports = [module.process([image_entry(0), image_entry(1)], iteration=10),  # usually None: nothing done yet
                   module.close(timeout_s=20)]
    assert len(server.requests) == 2
    request = server.requests[0]
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["Authorization"] == f"Bearer {KEY}"
    assert request["headers"]["Content-Type"] == "application/json"
    body = request["body"]
    assert body["model"] == "judge-model-1"
    (message,) = body["messages"]
    assert message["role"] == "user"
    text, image = message["content"]
    assert text["type"] == "text" and "a red square" in text["text"] and "0 (worst) to 10 (best)" in text["text"]
    assert image["type"] == "image_url"
    png = decode_png(image["image_url"]["url"])
    assert png.size == (64, 64) and png.mode == "RGB"  # an 8x8 sample, nearest-upscaled for the judge
    # the PNG holds the sample's pixels: its top-left pixel is the sample's first pixel mapped to [0, 255]
    expected = ((image_entry(0).data[:, 0, 0].clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).tolist()
    assert list(png.getpixel((0, 0))) == expected
    result = merged(*reports)
    assert result["scored"] == 2 and result["score_mean"] == 8.0  # 7 and 9
    assert result["failures"] == 0 and result["dropped"] == 0 and result["pending"] == 0
    assert all(r["loss_dict"]["latency_s"] >= 0 for r in reports if r and "latency_s" in r["loss_dict"])


def test_video_sends_uniform_frames(tmp_path: Path) -> None:
    with JudgeServer() as server:
        module = judge(server, tmp_path, num_frames=4, image_size=8)
        result = merged(module.process([video_entry(frames=9)], iteration=3), module.close(timeout_s=20))
    assert result["score_mean"] == 7.0
    content = server.requests[0]["body"]["messages"][0]["content"]
    assert "4 frames" in content[0]["text"]
    frames = [decode_png(part["image_url"]["url"]) for part in content[1:]]
    assert len(frames) == 4
    # frame t of the test video is the constant linspace(-1, 1, 9)[t]: frames 0, 3, 5, 8 (uniform, ends included)
    levels = [round((v + 1) * 127.5) for v in torch.linspace(-1, 1, 9)[[0, 3, 5, 8]].tolist()]
    assert [f.getpixel((0, 0))[0] for f in frames] == levels
    assert "Authorization" not in server.requests[0]["headers"]  # no key set: no header


def test_slow_judge_never_blocks_and_a_full_queue_drops_the_oldest(tmp_path: Path) -> None:
    release = threading.Event()
    with JudgeServer(default={"status": 200, "content": "Score: 6", "hold": release}) as server:
        module = judge(server, tmp_path, queue_size=2)
        # the judge holds every reply until released: process() must still return
        assert module.process([image_entry(0)], iteration=1) is None
        server.wait_for(1)  # the worker is now blocked inside the first request
        assert server.answered == 0 and module.pending() == 1
        report = module.process([image_entry(i) for i in range(1, 5)], iteration=2)  # 4 more, queue holds 2
        assert report is not None and report["loss_dict"]["dropped"] == 2.0
        assert report["loss_dict"]["pending"] == 3.0 and "score_mean" not in report["loss_dict"]
        assert server.answered == 0  # still nothing answered: process() returned while the judge was busy
        release.set()
        result = module.close(timeout_s=20)
    assert result["loss_dict"]["score_mean"] == 6.0 and result["loss_dict"]["scored"] == 3.0
    assert result["loss_dict"]["dropped"] == 2.0 and result["loss_dict"]["failures"] == 0.0
    captions = [r["body"]["messages"][0]["content"][0]["text"] for r in server.requests]
    assert len(captions) == 3  # the first one and the two newest; the two oldest queued were dropped


def test_500_then_success_is_retried(tmp_path: Path) -> None:
    with JudgeServer(script=[{"status": 500}, {"status": 503}, {"status": 200, "content": "Score: 8/10"}]) as server:
        module = judge(server, tmp_path, backoff_s=0.01, max_retries=3)
        result = merged(module.process([image_entry()], iteration=1), module.close(timeout_s=20))
    assert len(server.requests) == 3
    assert result["score_mean"] == 8.0 and result["failures"] == 0.0


def test_429_is_retried_but_other_4xx_are_not(tmp_path: Path) -> None:
    with JudgeServer(script=[{"status": 429}, {"status": 200, "content": "5"}, {"status": 400}]) as server:
        module = judge(server, tmp_path, backoff_s=0.01)
        first = merged(module.process([image_entry(0)], iteration=1), module.close(timeout_s=20))
        assert first["score_mean"] == 5.0 and first["failures"] == 0.0
        module = judge(server, tmp_path, backoff_s=0.01)
        result = merged(module.process([image_entry(1)], iteration=1), module.close(timeout_s=20))
    assert len(server.requests) == 3  # 429 + retry, then one 400 and no retry
    assert result["failures"] == 1.0 and "score_mean" not in result


def test_timeouts_are_retried_then_counted_as_failures(tmp_path: Path, fastgen_records) -> None:
    never = threading.Event()
    with JudgeServer(default={"status": 200, "content": "Score: 9", "hold": never}) as server:
        module = judge(server, tmp_path, timeout_s=0.2, max_retries=2, backoff_s=0.01)
        result = merged(module.process([image_entry()], iteration=1), module.close(timeout_s=30))
        assert len(server.requests) == 3  # the first attempt and two retries, each timed out
    assert result["failures"] == 1.0 and "score_mean" not in result
    assert any("timed out" in r.getMessage() for r in fastgen_records.records)


@pytest.mark.parametrize("reply", ["I cannot judge this image.", "", "Score: N/A"])
def test_unparsable_reply_is_a_failure_not_a_crash(tmp_path: Path, reply: str) -> None:
    with JudgeServer(default={"status": 200, "content": reply}) as server:
        module = judge(server, tmp_path)
        result = merged(module.process([image_entry()], iteration=1), module.close(timeout_s=20))
    assert len(server.requests) == 1  # a reply without a score is not retried
    assert result["failures"] == 1.0 and "score_mean" not in result


def test_drain_deadline_counts_unfinished_jobs_as_dropped(tmp_path: Path) -> None:
    release = threading.Event()
    with JudgeServer(default={"status": 200, "content": "Score: 6", "hold": release}) as server:
        module = judge(server, tmp_path, queue_size=8)
        module.process([image_entry(i) for i in range(3)], iteration=1)
        server.wait_for(1)
        result = module.close(timeout_s=0.05)  # the judge is stuck: give up on the two still queued
        assert result["loss_dict"]["dropped"] == 2.0
        assert module.process([image_entry(9)], iteration=2)["loss_dict"]["dropped"] == 3.0  # closed: dropped
        release.set()


def test_key_from_credentials_dir_and_never_logged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fastgen_records) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    creds = tmp_path / "credentials"
    creds.mkdir()
    (creds / "openai_api.txt").write_text(KEY + "\n")
    with JudgeServer(script=[{"status": 401}], default={"status": 200, "content": "Score: 4"}) as server:
        (creds / "VLM_BASE_URL.txt").write_text(server.base_url + "\n")
        monkeypatch.delenv("VLM_BASE_URL", raising=False)
        load_credentials(creds)
        module = VLMLogger(model="m")  # endpoint and key both from the credentials folder
        module.setup(tmp_path, is_rank0=True)
        reports = [module.process([image_entry(0)], iteration=1)]
        server.wait_for(1)
        reports.append(module.process([image_entry(1)], iteration=2))
        result = merged(*reports, module.close(timeout_s=20))
    assert all(r["headers"]["Authorization"] == f"Bearer {KEY}" for r in server.requests)
    assert result["failures"] == 1.0 and result["scored"] == 1.0  # the 401, then a score
    assert KEY not in repr(module) and KEY not in str(vars(module).get("endpoint"))
    assert fastgen_records.records, "the failure should have been reported"
    assert all(KEY not in r.getMessage() and KEY not in str(r.args) for r in fastgen_records.records)


def test_missing_endpoint_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLM_BASE_URL", raising=False)
    with pytest.raises(ConfigError, match="VLM_BASE_URL"):
        VLMLogger().setup(tmp_path, is_rank0=True)
    monkeypatch.setenv("VLM_BASE_URL", "http://127.0.0.1:9/v1/")
    module = VLMLogger()
    module.setup(tmp_path, is_rank0=True)
    assert module.endpoint == "http://127.0.0.1:9/v1/chat/completions"


def test_media_filter(tmp_path: Path) -> None:
    with JudgeServer() as server:
        module = judge(server, tmp_path, media="video")
        assert module.process([image_entry()], iteration=1) is None  # images are not judged in video mode
        module.close(timeout_s=5)
    assert server.requests == []


@pytest.mark.parametrize(("reply", "score"), [
    ("Score: 7/10", 7.0),
    ("score = 7.5", 7.5),
    ("7.5", 7.5),
    ("**8**", 8.0),
    ('{"score": 7}', 7.0),
    ('```json\n{"score": 6.5, "reason": "sharp"}\n```', 6.5),
    ('{"rating": "9/10"}', 9.0),
    ("Rating: 3 out of 5", 6.0),  # rescaled to 0..10
    ("I'd say 4/5 overall.", 8.0),
    ("Score: 14", 10.0),  # clamped
    ("Score: -2", 0.0),
    ("**Score:** 8", 8.0),
])
def test_parse_score(reply: str, score: float) -> None:
    assert parse_score(reply, 0.0, 10.0) == pytest.approx(score)


@pytest.mark.parametrize("reply", ["", "no idea", "The image shows 3 cats.", '{"score": "bad"}', "Score: nan", None])
def test_parse_score_unparsable(reply) -> None:
    assert parse_score(reply, 0.0, 10.0) is None

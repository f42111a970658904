"""Checks of the chunked causal video network contract (``fastgen.networks.kv_cache``), shared by the tests of
every such network (``tests/networks/test_causal_dit.py``, ``tests/networks/test_causal_wan.py``). Each takes a
``DiffusionNet`` (or a builder of one) whose backbone has ``chunk_frames``, ``kv_cache``, ``clear_caches``,
``cached_frames`` and ``kept_frames``, on ``(B, C, F, H, W)`` videos with per-frame times ``(B, F)`` and labels."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from fastgen.networks.causal_sampling import sample_chunks


def cached_pass(net: nn.Module, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None,
                tag: str = "cond") -> torch.Tensor:
    """The video chunk by chunk, each chunk written into tag ``tag``'s cache after it is computed."""
    chunk = int(net.backbone.chunk_frames)
    out = []
    with net.backbone.kv_cache(tag, write=True):
        for start in range(0, x.shape[2], chunk):
            out.append(net(x[:, :, start:start + chunk], t[:, start:start + chunk], condition=y))
    return torch.cat(out, dim=2)


@torch.no_grad()
def check_cached_equals_full(net: nn.Module, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> None:
    """A KV-cached chunk-by-chunk pass equals the masked full pass."""
    full = net(x, t, condition=y)
    cached = cached_pass(net, x, t, y)
    assert net.backbone.cached_frames("cond") == x.shape[2] == net.backbone.kept_frames("cond")
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=0)


def check_later_chunks_never_change_earlier_ones(make: Callable[[bool], nn.Module], x: torch.Tensor, t: torch.Tensor,
                                                y: torch.Tensor) -> None:
    """Changing the second half of the video leaves the first half's output as it is when causal (``make(True)``),
    and changes it when bidirectional (``make(False)``)."""
    half = x.shape[2] // 2
    changed = x.clone()
    changed[:, :, half:] = torch.randn_like(x[:, :, half:])
    for causal in (True, False):
        net = make(causal)
        with torch.no_grad():
            before, after = net(x, t, condition=y), net(changed, t, condition=y)
        earlier = float((before[:, :, :half] - after[:, :, :half]).abs().max())
        assert (earlier == 0.0) if causal else (earlier > 1e-3), (causal, earlier)
        assert float((before[:, :, half:] - after[:, :, half:]).abs().max()) > 1e-3


@torch.no_grad()
def check_tagged_caches(net: nn.Module, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> None:
    """Two tags hold separate caches (a conditional and an unconditional one under guidance), a read-only call
    leaves its tag's cache as it is (a generation's inner steps), ``clear_caches`` empties them all, and a cached
    call that is not whole chunks is refused."""
    backbone = net.backbone
    chunk = int(backbone.chunk_frames)
    second = slice(chunk, 2 * chunk)
    full, unconditional = net(x, t, condition=y), net(x, t, condition=None)
    with backbone.kv_cache("cond", write=True):
        net(x[:, :, :chunk], t[:, :chunk], condition=y)
    with backbone.kv_cache("uncond", write=True):
        net(x[:, :, :chunk], t[:, :chunk], condition=None)
    with backbone.kv_cache("cond"):
        step = net(x[:, :, second], t[:, second], condition=y)
        again = net(x[:, :, second], t[:, second], condition=y)
    with backbone.kv_cache("uncond"):
        other = net(x[:, :, second], t[:, second], condition=None)
    assert backbone.cached_frames("cond") == chunk and backbone.cached_frames("uncond") == chunk
    torch.testing.assert_close(step, full[:, :, second], atol=1e-5, rtol=0)
    torch.testing.assert_close(other, unconditional[:, :, second], atol=1e-5, rtol=0)
    torch.testing.assert_close(again, step, atol=0, rtol=0)
    backbone.clear_caches()
    assert backbone.cached_frames("cond") == 0 and backbone.cached_frames("uncond") == 0
    if chunk > 1:
        with pytest.raises(ValueError, match="chunk by chunk"), backbone.kv_cache("cond", write=True):
            net(x[:, :, :1], t[:, :1], condition=y)


def check_sampling_with_the_cache_equals_rerunning_the_prefix(net: nn.Module, noise: torch.Tensor, y: torch.Tensor,
                                                              guidance: float | None, context_time: float,
                                                              num_classes: int = 10) -> None:
    """``sample_chunks`` with its KV cache (two tags under guidance; the finished chunk cached clean or at a
    context noise level) gives the video that re-running the whole prefix for every evaluation gives."""
    kwargs = dict(steps=3, guidance=guidance, num_classes=num_classes, context_time=context_time)
    cached = sample_chunks(net, noise, y, generator=torch.Generator().manual_seed(4), **kwargs)
    rerun = sample_chunks(net, noise, y, use_cache=False, generator=torch.Generator().manual_seed(4), **kwargs)
    assert cached.shape == noise.shape and net.backbone.cached_frames("cond") == 0  # caches cleared after
    torch.testing.assert_close(cached, rerun, atol=1e-4, rtol=0)


def check_a_rolling_cache_generates_past_the_trained_length(net: nn.Module, noise: torch.Tensor, y: torch.Tensor,
                                                            keep_frames: int, num_classes: int = 10) -> None:
    """``noise`` longer than the network was trained on, attending to the last ``keep_frames`` frames: the cache
    never holds more, frames keep their absolute positions (the chunks before the window is full equal a plain
    generation's of the first half), a chunk past the window no longer matches, and the video is finite."""
    backbone = net.backbone
    kept: list[int] = []
    original = backbone.forward

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        kept.append(backbone.kept_frames("cond"))
        return original(*args, **kwargs)

    backbone.forward = spy
    try:
        long = sample_chunks(net, noise, y, steps=2, num_classes=num_classes, keep_frames=keep_frames)
    finally:
        backbone.forward = original
    half = noise.shape[2] // 2
    short = sample_chunks(net, noise[:, :, :half], y, steps=2, num_classes=num_classes)
    chunk = int(backbone.chunk_frames)
    assert long.shape == noise.shape and torch.isfinite(long).all()
    assert max(kept) == keep_frames and 0 in kept
    window = keep_frames + chunk  # chunks that still see the first chunk
    torch.testing.assert_close(long[:, :, :window], short[:, :, :window], atol=1e-5, rtol=0)
    assert float((long[:, :, half - chunk:half] - short[:, :, half - chunk:]).abs().max()) > 0


@torch.no_grad()
def check_flex_matches_sdpa(make: Callable[[str], nn.Module], x: torch.Tensor, t: torch.Tensor,
                            y: torch.Tensor) -> None:
    """The flex-attention path (``make("flex")``; eager on CPU, compiled on CUDA) masks as the SDPA path
    (``make("sdpa")``) does, in the full pass and in a cached call whose queries span two chunks."""
    import warnings

    pytest.importorskip("torch.nn.attention.flex_attention")
    sdpa, flex = make("sdpa"), make("flex")
    chunk = int(sdpa.backbone.chunk_frames)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex attention warns that it is a reference implementation
        full = sdpa(x, t, condition=y)
        torch.testing.assert_close(flex(x, t, condition=y), full, atol=1e-5, rtol=0)
        outs = []
        for net in (sdpa, flex):
            with net.backbone.kv_cache("cond", write=True):
                net(x[:, :, :chunk], t[:, :chunk], condition=y)
            with net.backbone.kv_cache("cond"):
                outs.append(net(x[:, :, chunk:3 * chunk], t[:, chunk:3 * chunk], condition=y))
    torch.testing.assert_close(outs[0], full[:, :, chunk:3 * chunk], atol=1e-5, rtol=0)
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=0)

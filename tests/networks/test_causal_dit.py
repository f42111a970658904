"""The block-causal video DiT (``fastgen.networks.causal_dit``) and diffusion forcing (``fastgen.methods.causal_sft``):
a KV-cached chunk-by-chunk pass equals the masked full pass; a later chunk never changes an earlier chunk's output
(and does in the bidirectional network); caches are tagged, written only when asked, and cleared; per-frame times
go through ``DiffusionNet``; CausalSFT draws one time per chunk."""

from __future__ import annotations

import pytest
import torch

from fastgen.configs.instantiate import instantiate
from fastgen.configs.net_dit import causal_video_dit


def network(causal: bool = True):  # noqa: ANN201
    torch.manual_seed(0)
    net = instantiate(causal_video_dit(hidden_size=32, depth=2, num_heads=2, causal=causal))
    with torch.no_grad():  # adaLN-Zero starts at the identity: randomise so every path matters
        for p in net.parameters():
            p.normal_(0.0, 0.1)
    return net


def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(2, 1, 8, 8, 16, generator=g), torch.rand(2, 8, generator=g) * 0.9 + 0.05, torch.tensor([3, 7])


def test_cached_chunk_by_chunk_equals_the_masked_full_pass() -> None:
    net = network()
    x, t, y = inputs()
    with torch.no_grad():
        full = net(x, t, condition=y)
        chunks = []
        with net.backbone.kv_cache("cond", write=True):
            for c in range(4):
                chunks.append(net(x[:, :, 2 * c:2 * c + 2], t[:, 2 * c:2 * c + 2], condition=y))
    assert net.backbone.cached_frames("cond") == 8
    torch.testing.assert_close(torch.cat(chunks, dim=2), full, atol=1e-5, rtol=0)


def test_a_later_chunk_never_changes_an_earlier_chunks_output() -> None:
    x, t, y = inputs()
    changed = x.clone()
    changed[:, :, 4:] = torch.randn(2, 1, 4, 8, 16)
    for causal in (True, False):
        net = network(causal)
        with torch.no_grad():
            before, after = net(x, t, condition=y), net(changed, t, condition=y)
        earlier = float((before[:, :, :4] - after[:, :, :4]).abs().max())
        assert (earlier == 0.0) if causal else (earlier > 1e-3), (causal, earlier)
        assert float((before[:, :, 4:] - after[:, :, 4:]).abs().max()) > 1e-3


def test_caches_are_tagged_written_only_when_asked_and_cleared() -> None:
    net = network()
    backbone = net.backbone
    x, t, y = inputs()
    with torch.no_grad():
        full = net(x, t, condition=y)
        with backbone.kv_cache("cond", write=True):
            net(x[:, :, :2], t[:, :2], condition=y)
        with backbone.kv_cache("uncond", write=True):
            net(x[:, :, :2], t[:, :2], condition=None)
        # denoising steps on chunk 1 read the cache and leave it as it is (a generation's inner steps)
        with backbone.kv_cache("cond"):
            step = net(x[:, :, 2:4], t[:, 2:4], condition=y)
            again = net(x[:, :, 2:4], t[:, 2:4], condition=y)
    assert backbone.cached_frames("cond") == 2 and backbone.cached_frames("uncond") == 2
    torch.testing.assert_close(step, full[:, :, 2:4], atol=1e-5, rtol=0)
    torch.testing.assert_close(again, step)
    backbone.clear_caches()
    assert backbone.cached_frames("cond") == 0 and backbone.cached_frames("uncond") == 0
    with pytest.raises(ValueError, match="chunk by chunk"):
        with backbone.kv_cache("cond", write=True), torch.no_grad():
            net(x[:, :, :1], t[:, :1], condition=y)


def test_per_frame_times_are_each_frames_own() -> None:
    """``(B, F)`` times: a frame's output depends on its own time (its chunk's), the preconditioning too."""
    net = network(causal=False)
    x, t, y = inputs()
    moved = t.clone()
    moved[:, 5] = 0.5 * t[:, 5]
    with torch.no_grad():
        a, b = net(x, t, condition=y), net(x, moved, condition=y)
        same = net(x, t[:, :1].expand(2, 8), condition=y)
        scalar = net(x, t[:, 0], condition=y)
    assert float((a[:, :, 5] - b[:, :, 5]).abs().max()) > 1e-3
    torch.testing.assert_close(same, scalar)


def test_causal_sft_draws_one_time_per_chunk_and_trains(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    from fastgen.configs.config_utils import load_config
    from fastgen.trainer import Trainer

    config = load_config("Digits/config_causal_sft_moving_digits")
    model = instantiate(config.model_class, config=config.model)
    data = {"real": torch.randn(4, 1, 8, 8, 16), "condition": torch.tensor([0, 1, 2, 3])}
    loss, out = model.single_train_step(data, 0)
    t = out["t"]
    assert t.shape == (4, 8) and torch.equal(t[:, 0::2], t[:, 1::2])  # chunks of 2 frames share a time
    assert len(torch.unique(t[:, ::2])) == 16  # every chunk of every sample its own draw
    assert torch.isfinite(loss["total_loss"])
    monkeypatch.setenv("FASTGEN_OUTPUT_ROOT", str(tmp_path))
    monkeypatch.setenv("WANDB_MODE", "disabled")
    config.trainer.max_iter = 2
    config.trainer.save_ckpt_iter = 2
    config.dataloader_train.batch_size = 4
    trained = Trainer(config).run()
    videos, _ = trained.sample(2, generator=torch.Generator().manual_seed(0), steps=2)
    assert videos.shape == (2, 1, 8, 8, 16) and torch.isfinite(videos).all()


@pytest.mark.parametrize("guidance,context_time", [(None, 0.0), (2.0, 0.1)])
def test_chunk_by_chunk_generation_with_the_cache_equals_rerunning_the_prefix(guidance, context_time) -> None:  # noqa: ANN001
    """The sampler with its KV cache (two tags under guidance; the finished chunk cached clean or at a context
    noise level) gives the video that re-running the whole prefix for every evaluation gives."""
    from fastgen.networks.causal_sampling import sample_chunks

    net = network()
    noise, _, y = inputs()
    cached = sample_chunks(net, noise, y, steps=3, guidance=guidance, num_classes=10, context_time=context_time,
                           generator=torch.Generator().manual_seed(4))
    rerun = sample_chunks(net, noise, y, steps=3, guidance=guidance, num_classes=10, context_time=context_time,
                          use_cache=False, generator=torch.Generator().manual_seed(4))
    assert cached.shape == noise.shape and net.backbone.cached_frames("cond") == 0  # caches cleared after
    torch.testing.assert_close(cached, rerun, atol=1e-4, rtol=0)


def test_a_rolling_cache_generates_past_the_trained_length() -> None:
    """16 frames from a network built for 8, attending to the last 4 frames: the cache never holds more, frames
    keep their absolute positions (the first chunk equals a plain generation's), and the video is finite."""
    from fastgen.networks.causal_sampling import sample_chunks

    net = network()
    backbone = net.backbone
    kept: list[int] = []
    original = backbone.forward

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        kept.append(backbone.kept_frames("cond"))
        return original(*args, **kwargs)

    backbone.forward = spy
    noise = torch.randn(2, 1, 16, 8, 16, generator=torch.Generator().manual_seed(5))
    long = sample_chunks(net, noise, torch.tensor([1, 2]), steps=2, num_classes=10, keep_frames=4)
    backbone.forward = original
    short = sample_chunks(net, noise[:, :, :8], torch.tensor([1, 2]), steps=2, num_classes=10)
    assert long.shape == (2, 1, 16, 8, 16) and torch.isfinite(long).all()
    assert max(kept) == 4 and 0 in kept
    torch.testing.assert_close(long[:, :, :4], short[:, :, :4], atol=1e-5, rtol=0)  # the window is not full yet
    assert float((long[:, :, 6:8] - short[:, :, 6:8]).abs().max()) > 0  # chunk 3 no longer sees chunk 0

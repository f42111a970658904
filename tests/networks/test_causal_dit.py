"""The block-causal video DiT (``fastgen.networks.causal_dit``) and diffusion forcing (``fastgen.methods.causal_sft``):
a KV-cached chunk-by-chunk pass equals the masked full pass; a later chunk never changes an earlier chunk's output
(and does in the bidirectional network); caches are tagged, written only when asked, and cleared; per-frame times
go through ``DiffusionNet``; CausalSFT draws one time per chunk."""

from __future__ import annotations

import pytest
import torch
from causal_checks import (
    check_a_rolling_cache_generates_past_the_trained_length,
    check_cached_equals_full,
    check_flex_matches_sdpa,
    check_later_chunks_never_change_earlier_ones,
    check_sampling_with_the_cache_equals_rerunning_the_prefix,
    check_tagged_caches,
)

from fastgen.configs.instantiate import instantiate
from fastgen.configs.net_dit import causal_video_dit


def network(causal: bool = True, attention_backend: str = "auto"):  # noqa: ANN201
    torch.manual_seed(0)
    net = instantiate(causal_video_dit(hidden_size=32, depth=2, num_heads=2, causal=causal,
                                       attention_backend=attention_backend))
    with torch.no_grad():  # adaLN-Zero starts at the identity: randomise so every path matters
        for p in net.parameters():
            p.normal_(0.0, 0.1)
    return net


def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(2, 1, 8, 8, 16, generator=g), torch.rand(2, 8, generator=g) * 0.9 + 0.05, torch.tensor([3, 7])


def test_the_flex_block_mask_matches_the_sdpa_mask() -> None:
    check_flex_matches_sdpa(lambda backend: network(attention_backend=backend), *inputs())


def test_cached_chunk_by_chunk_equals_the_masked_full_pass() -> None:
    check_cached_equals_full(network(), *inputs())


def test_a_later_chunk_never_changes_an_earlier_chunks_output() -> None:
    check_later_chunks_never_change_earlier_ones(network, *inputs())


def test_caches_are_tagged_written_only_when_asked_and_cleared() -> None:
    check_tagged_caches(network(), *inputs())


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
def test_chunk_by_chunk_generation_with_the_cache_equals_rerunning_the_prefix(guidance: float | None,
                                                                            context_time: float) -> None:
    noise, _, y = inputs()
    check_sampling_with_the_cache_equals_rerunning_the_prefix(network(), noise, y, guidance, context_time)


def test_a_rolling_cache_generates_past_the_trained_length() -> None:
    """16 frames from a network built for 8, attending to the last 4 frames."""
    noise = torch.randn(2, 1, 16, 8, 16, generator=torch.Generator().manual_seed(5))
    check_a_rolling_cache_generates_past_the_trained_length(network(), noise, torch.tensor([1, 2]), keep_frames=4)

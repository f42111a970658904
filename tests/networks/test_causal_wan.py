"""The block-causal Wan (``fastgen.networks.causal_wan``): bidirectional it is the stock ``WanTransformer`` (same
weights, same output, per-frame times as Wan 2.2's per-token path); causal, a KV-cached chunk-by-chunk pass equals
the masked full pass (per-frame times, absolute rotary positions), a later chunk never changes an earlier chunk's
output, caches are tagged, written only when asked and cleared, the SDPA mask and the flex block mask agree, the
rolling cache generates past the trained length, cached sampling equals re-running the prefix, and the causal
methods (CausalSFT, Self-Forcing) train with it."""

from __future__ import annotations

from pathlib import Path

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
from fastgen.configs.net_diffusers import TINY_WAN, causal_wan_transformer, wan_transformer
from fastgen.utils.errors import ConfigError

pytest.importorskip("diffusers")


def network(causal: bool = True, config: dict | None = None, **kwargs):  # noqa: ANN003, ANN201
    torch.manual_seed(0)
    return instantiate(causal_wan_transformer(config or TINY_WAN, chunk_frames=2, causal=causal, num_prompts=10,
                                              shift=1.0, **kwargs))


def inputs(frames: int = 8) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 1, frames, 8, 16, generator=g)
    return x, torch.rand(2, frames, generator=g) * 0.9 + 0.05, torch.tensor([3, 7])


def test_bidirectional_is_the_stock_wan_with_the_teachers_weights() -> None:
    """``causal=False`` loads a ``WanTransformer``'s state dict as it is and gives its output and feature maps;
    per-frame times give the stock model's per-token (Wan 2.2) timestep path."""
    torch.manual_seed(0)
    stock = instantiate(wan_transformer(TINY_WAN, num_prompts=10, shift=1.0))
    net = network(causal=False)
    net.load_state_dict(stock.state_dict())  # strict: the same parameter and buffer names
    x, t, y = inputs()
    with torch.no_grad():
        want, want_features = stock.backbone(x, t[:, 0], y, feature_indices=[0, 1])
        got, got_features = net.backbone(x, t[:, 0], y, feature_indices=[0, 1])
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
        for a, b in zip(got_features, want_features):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
        backbone = stock.backbone
        text = backbone.text_embeddings(y, 2, x.dtype, x.device)
        per_token = (t * 1000.0).repeat_interleave(4 * 8, dim=1)  # 8 frames of 4 x 8 tokens
        want = backbone.model(x, per_token, text, return_dict=False)[0]
        torch.testing.assert_close(net.backbone(x, t, y), want, atol=1e-6, rtol=0)


def test_cached_chunk_by_chunk_equals_the_masked_full_pass() -> None:
    check_cached_equals_full(network(), *inputs())


def test_temporal_patches_chunk_in_token_frames() -> None:
    """``patch_size[0] = 2``: a 2-frame chunk is one token frame; the cached pass still equals the full one."""
    config = {**TINY_WAN, "patch_size": [2, 2, 2]}
    check_cached_equals_full(network(config=config), *inputs())
    with pytest.raises(ConfigError, match="multiple of the temporal patch size 2"):
        instantiate(causal_wan_transformer(config, chunk_frames=3))
    with pytest.raises(ConfigError, match="attention_backend"):
        instantiate(causal_wan_transformer(TINY_WAN, attention_backend="flash"))


def test_a_later_chunk_never_changes_an_earlier_chunks_output() -> None:
    check_later_chunks_never_change_earlier_ones(network, *inputs())


def test_caches_are_tagged_written_only_when_asked_and_cleared() -> None:
    check_tagged_caches(network(), *inputs())


def test_the_flex_block_mask_matches_the_sdpa_mask() -> None:
    check_flex_matches_sdpa(lambda backend: network(attention_backend=backend), *inputs())


def test_gradient_checkpointing_recomputes_with_the_same_mask() -> None:
    x, t, y = inputs()
    grads = []
    for checkpointing in (False, True):
        net = network()
        if checkpointing:
            net.backbone.model.enable_gradient_checkpointing()
        net(x, t, condition=y).square().mean().backward()
        grads.append(net.backbone.model.blocks[0].attn1.to_q.weight.grad.clone())
    torch.testing.assert_close(grads[1], grads[0], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("guidance,context_time", [(None, 0.0), (2.0, 0.1)])
def test_chunk_by_chunk_generation_with_the_cache_equals_rerunning_the_prefix(guidance: float | None,
                                                                            context_time: float) -> None:
    noise, _, y = inputs()
    check_sampling_with_the_cache_equals_rerunning_the_prefix(network(), noise, y, guidance, context_time)


def test_a_rolling_cache_generates_past_the_trained_length() -> None:
    """16 frames (the recipes train on 8) attending to the last 4; positions past ``rope_max_seq_len`` are a
    one-line error."""
    net = network()
    noise = torch.randn(2, 1, 16, 8, 16, generator=torch.Generator().manual_seed(5))
    check_a_rolling_cache_generates_past_the_trained_length(net, noise, torch.tensor([1, 2]), keep_frames=4)
    with pytest.raises(ValueError, match="rope_max_seq_len"), torch.no_grad():
        net(torch.zeros(1, 1, 40, 8, 16), torch.ones(1))


def test_a_diffusers_weights_folder_initialises_the_causal_wan(tmp_path: Path) -> None:
    """``model.pretrained_model_path`` works for the causal Wan as for the stock one: the config checks accept it,
    the folder's architecture (here a wider FFN than the recipe's) is adopted and its weights load strictly - a
    diffusers Wan becomes a block-causal student as it is."""
    from diffusers import WanTransformer3DModel

    from fastgen.configs.config_utils import load_config, validate_config
    from fastgen.networks.causal_wan import CausalWanTransformer
    from fastgen.networks.diffusers_nets import diffusers_backbone_class

    torch.manual_seed(1)
    WanTransformer3DModel(**{**TINY_WAN, "ffn_dim": 48}).save_pretrained(tmp_path / "weights" / "transformer")
    config = load_config("Digits/config_causal_sft_wan_moving_digits")
    config.model.net = causal_wan_transformer(TINY_WAN, chunk_frames=2, num_prompts=10, shift=1.0)
    config.model.pretrained_model_path = str(tmp_path / "weights")
    validate_config(config)
    assert diffusers_backbone_class(config.model.net) is CausalWanTransformer
    model = instantiate(config.model_class, config=config.model)
    model.init_weights()
    saved = WanTransformer3DModel.from_pretrained(tmp_path / "weights" / "transformer").state_dict()
    assert model.net.backbone.model.config.ffn_dim == 48 and model.net.backbone.causal
    assert all(torch.equal(model.net.backbone.model.state_dict()[k], v) for k, v in saved.items())


def test_causal_sft_trains_and_samples_the_causal_wan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastgen.configs.config_utils import load_config
    from fastgen.trainer import Trainer

    monkeypatch.setenv("FASTGEN_OUTPUT_ROOT", str(tmp_path))
    monkeypatch.setenv("WANDB_MODE", "disabled")
    config = load_config("Digits/config_causal_sft_wan_moving_digits")
    config.model.net = causal_wan_transformer(TINY_WAN, chunk_frames=2, num_prompts=10, shift=1.0)
    config.trainer.max_iter = 2
    config.trainer.save_ckpt_iter = 2
    config.dataloader_train.batch_size = 4
    trained = Trainer(config).run()
    videos, _ = trained.sample(2, generator=torch.Generator().manual_seed(0), steps=2)
    assert videos.shape == (2, 1, 8, 8, 16) and torch.isfinite(videos).all()
    # a diffusers pipeline would run the network bidirectionally: the export is refused in one line
    from fastgen.pipelines.export import export_diffusers
    from fastgen.utils.errors import UsageError

    with pytest.raises(UsageError, match="block-causal"):
        export_diffusers(str(config.log_config.save_path), str(tmp_path / "export"))


def test_self_forcing_trains_a_causal_wan_student(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recipe's networks at toy size: the student starts as the bidirectional teacher's copy (same names; the
    first student step's DMD gradient is then zero, fake score = teacher), the fake score trains, the next student
    step moves the student, and it samples chunk by chunk."""
    from fastgen.configs.config_utils import load_config
    from fastgen.trainer import Trainer

    monkeypatch.setenv("FASTGEN_OUTPUT_ROOT", str(tmp_path))
    monkeypatch.setenv("WANDB_MODE", "disabled")
    config = load_config("Digits/config_self_forcing_wan_moving_digits")
    config.model.net = causal_wan_transformer(TINY_WAN, chunk_frames=2, num_prompts=10, shift=1.0)
    config.model.teacher = wan_transformer(TINY_WAN, num_prompts=10, shift=1.0)
    config.model.fake_score = wan_transformer(TINY_WAN, num_prompts=10, shift=1.0)
    config.model.teacher_ckpt = None
    config.model.student_update_freq = 2  # student, critic, student: the second student step has a gradient
    config.trainer.max_iter = 3
    config.trainer.save_ckpt_iter = 3
    config.dataloader_train.batch_size = 4
    model = Trainer(config).run()
    assert type(model.net.backbone).__name__ == "CausalWanTransformer" and model.net.backbone.causal
    assert sorted(p.name for p in tmp_path.rglob("checkpoints/*.pth")) == ["0000003.pth"]
    teacher = model.teacher.state_dict()
    for name, module in (("net", model.net), ("fake_score", model.fake_score)):
        moved = [k for k, v in module.state_dict().items() if k in teacher and not torch.equal(v, teacher[k])]
        assert moved, f"{name} did not train"
    videos, _ = model.sample(2, generator=torch.Generator().manual_seed(0))
    assert videos.shape == (2, 1, 8, 8, 16) and torch.isfinite(videos).all()

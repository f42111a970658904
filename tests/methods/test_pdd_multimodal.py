"""PDD (``fastgen.methods.pdd``) on multimodal samples (``model.modality_shapes``: LTX-2's video and audio): each
stream's output projection is widened into its own heads (``head_projections()``), every head starts as the teacher
of its stream (loss 0 at ``k = n``), the targets are the teacher's per-modality guided velocities and the loss the
weighted sum of the per-modality regressions, a fused block of one interval is that interval's Euler step for both
streams, the tiny LTX-2 trains through the real trainer and samples with any step count, and what is not supported
is refused in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from multimodal_nets import TwoStream, two_stream_net
from fastgen_testing import two_iterations

from fastgen.configs.instantiate import instantiate
from fastgen.configs.methods.config_pdd import create_config
from fastgen.methods.pdd import PDDModel
from fastgen.networks.heads import HeadProjection, head_projections_of, widen_outputs
from fastgen.utils.errors import ConfigError

SHAPES = {"video": [1, 2, 3, 4], "audio": [2, 3, 5]}
LABELS = torch.tensor([0, 1, 2, 0])


def sample_of(batch: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(batch, *shape, generator=g) for name, shape in SHAPES.items()}


def build(**model: Any) -> PDDModel:
    """A PDD student of the toy two-stream net (3 classes, a hidden layer: the heads are the last linear layer of
    each stream) on a 4-interval grid, its teacher random."""
    config = create_config()
    config.model.num_classes = 3
    config.model.net = two_stream_net(SHAPES, num_classes=3, hidden=16)
    config.model.modality_shapes = dict(SHAPES)
    config.model.teacher_ckpt = None
    config.model.grid_size = 4
    config.model.grid_shift = 2.0
    for key, value in model.items():
        setattr(config.model, key, value)
    torch.manual_seed(0)
    pdd = instantiate(config.model_class, config=config.model)
    pdd.init_weights()
    return pdd


def perturbed_heads(pdd: PDDModel) -> None:
    """Make the heads differ from each other and from the other stream's (a trained student's do)."""
    with torch.no_grad():
        for projection in head_projections_of(pdd.net).values():
            projection.weight.add_(torch.randn_like(projection.weight) * 0.1)
            projection.bias.add_(torch.randn_like(projection.bias) * 0.1)


def test_each_stream_has_its_own_heads_and_every_head_starts_as_the_teacher() -> None:
    pdd = build(block_size_max=1)  # k = n
    projections = head_projections_of(pdd.net)
    assert set(projections) == {"video", "audio"}
    assert all(isinstance(p, HeadProjection) and p.heads == 4 for p in projections.values())
    assert projections["video"] is not projections["audio"]
    assert projections["video"].base_out == 24 and projections["audio"].base_out == 30
    x = {name: v * 0.5 for name, v in sample_of(4, seed=3).items()}
    t = torch.tensor([0.9, 0.6, 0.3, 0.1])
    heads = pdd.student_velocity(pdd.net, x, t, LABELS)
    teacher = pdd.teacher_velocity(x, t, LABELS)
    for name, shape in SHAPES.items():
        assert heads[name].shape == (4, 4, *shape)
        assert float(teacher[name].abs().mean()) > 0.1  # a real velocity, not zeros
        torch.testing.assert_close(heads[name], teacher[name][:, None].expand_as(heads[name]), rtol=1e-5, atol=1e-5)
    loss, _ = pdd.single_train_step({"real": sample_of(4), "condition": LABELS}, 0)
    assert float(loss["total_loss"].detach()) < 1e-10
    assert {"pdd_loss_video", "pdd_loss_audio"} <= set(loss)
    loss, _ = build().single_train_step({"real": sample_of(32, seed=1), "condition": torch.arange(32) % 3}, 0)
    assert float(loss["pdd_target_span"]) > 0  # k > n: the student's path differs from the teacher's
    assert float(loss["pdd_loss_video"]) > 1e-6 and float(loss["pdd_loss_audio"]) > 1e-6


def test_the_loss_is_the_weighted_sum_of_each_streams_regression_onto_the_guided_teacher() -> None:
    """Head ``k`` of each stream regresses onto the teacher's velocity at ``(x̄_k, t_k)`` guided with that stream's
    scale (``u + s_m (c - u)``, Ho & Salimans 2022, Eq. 6), ``x̄_k`` integrated with the stream's own heads; the
    total is ``sum_m w_m L_m``; both streams' heads get gradients."""
    pdd = build(guidance_scale=2.0, modality_guidance_scales={"audio": 4.0}, modality_loss_weights={"audio": 0.5})
    perturbed_heads(pdd)
    data = {"real": sample_of(8, seed=2), "condition": torch.arange(8) % 3}
    loss, out = pdd.single_train_step(data, 0)
    torch.testing.assert_close(loss["total_loss"], loss["pdd_loss_video"] + 0.5 * loss["pdd_loss_audio"])
    x_k, target = out["generated"], out["target"]
    for name in SHAPES:
        assert x_k[name].shape == (8, *SHAPES[name]) and target[name].shape == (8, *SHAPES[name])
    # the teacher's velocity is each stream's guided x0 estimate, with that stream's scale, as a velocity
    # (the step's own use of it at (x̄_k, t_k): test_each_stream_loss_is_its_own_heads_regression)
    t_k = torch.full((8,), 0.4)
    onehot = torch.nn.functional.one_hot(data["condition"], 3).float()
    with torch.no_grad():
        c = pdd.teacher(x_k, t_k, condition=onehot, fwd_pred_type="x0")
        u = pdd.teacher(x_k, t_k, condition=torch.zeros_like(onehot), fwd_pred_type="x0")
        guided = pdd.teacher_velocity(x_k, t_k, data["condition"])
    for name, scale in (("video", 2.0), ("audio", 4.0)):
        x0 = u[name] + scale * (c[name] - u[name])
        torch.testing.assert_close(guided[name], (x_k[name] - x0) / 0.4, rtol=1e-4, atol=1e-5)
    loss["total_loss"].backward()
    for name, projection in head_projections_of(pdd.net).items():
        assert projection.weight.grad is not None and float(projection.weight.grad.abs().sum()) > 0, name


def test_each_stream_loss_is_its_own_heads_regression() -> None:
    """Recomputing the step by hand: the drawn ``(n, k)``, each stream noised to ``x_n`` at the shared ``t_n``,
    ``x̄_k`` from that stream's heads ``n..k-1``, and ``L_m`` the mean squared error of its head ``k``."""
    from fastgen.distributed.keyed_rng import KeyedNoise

    pdd = build(teacher_integrator="midpoint")
    perturbed_heads(pdd)
    data = {"real": sample_of(6, seed=5), "condition": torch.arange(6) % 3}
    pdd._bound_noise = KeyedNoise(0, torch.arange(6), 7, "train")
    try:
        loss, out = pdd.single_train_step(data, 7)
    finally:
        pdd._bound_noise = None
    pdd._bound_noise = KeyedNoise(0, torch.arange(6), 7, "train")  # the same draws again
    try:
        n, k = pdd.draw_intervals(6, torch.device("cpu"))
        eps = {name: pdd.rng.randn_like(v) for name, v in data["real"].items()}
    finally:
        pdd._bound_noise = None
    grid = pdd.grid.float()
    t_n, t_k = grid[n], grid[k]
    shape = {name: (-1, *[1] * len(s)) for name, s in SHAPES.items()}
    x_n = {m: (1 - t_n.reshape(shape[m])) * data["real"][m] + t_n.reshape(shape[m]) * eps[m] for m in SHAPES}
    with torch.no_grad():
        heads = pdd.student_velocity(pdd.net, x_n, t_n, data["condition"])
        x_k = {}
        for m in SHAPES:
            x_k[m] = x_n[m].clone()
            for b in range(6):
                for j in range(int(n[b]), int(k[b])):
                    x_k[m][b] += (grid[j + 1] - grid[j]) * heads[m][b, j]
        v = pdd.teacher_velocity(x_k, t_k, data["condition"])
        half = (grid[k + 1] - grid[k]) / 2
        target = pdd.teacher_velocity({m: x_k[m] + half.reshape(shape[m]) * v[m] for m in SHAPES}, t_k + half,
                                      data["condition"])
    for m in SHAPES:
        torch.testing.assert_close(out["generated"][m], x_k[m], rtol=1e-5, atol=1e-5)
        expected = (heads[m][torch.arange(6), k] - target[m]).square().mean()
        torch.testing.assert_close(loss[f"pdd_loss_{m}"], expected, rtol=1e-4, atol=1e-6)


def test_a_fused_block_of_one_interval_is_that_intervals_euler_step_for_both_streams() -> None:
    pdd = build()
    perturbed_heads(pdd)
    sigma = float(pdd.noise_scheduler.sigma(torch.tensor(pdd.noise_scheduler.t_max)))
    noise = {name: v * sigma for name, v in sample_of(4, seed=4).items()}
    grid = pdd.grid.float()
    with torch.no_grad():
        sampled = pdd.generate(pdd.net, noise, LABELS, blocks=[1] * 4)
        x = {name: grid[0] * v / sigma for name, v in noise.items()}
        for j in range(4):  # head j of each stream's all-heads pass at x_j: the per-interval Euler step
            v = pdd.student_velocity(pdd.net, x, grid[j].expand(4), LABELS)
            x = {name: x[name] + (grid[j + 1] - grid[j]) * v[name][:, j] for name in x}
        fused = pdd.generate(pdd.net, noise, LABELS, blocks=[1, 3])  # another partition of the same student
    for name in SHAPES:
        torch.testing.assert_close(sampled[name], x[name], rtol=1e-4, atol=1e-5)
        assert fused[name].shape == sampled[name].shape and torch.isfinite(fused[name]).all()
    samples, labels = pdd.sample(3, generator=torch.Generator().manual_seed(0), steps=2)
    assert {n: list(v.shape[1:]) for n, v in samples.items()} == SHAPES and labels.tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="teacher samples with Heun"):
        pdd.generate(pdd.teacher, noise, LABELS)


class SharedHead(TwoStream):
    def head_projections(self) -> dict:  # both streams naming one projection
        spec = super().head_projections()["video"]
        return {"video": spec, "audio": spec}


def test_what_is_not_supported_is_refused() -> None:
    with pytest.raises(ConfigError, match="modality_times"):
        build(modality_times="independent")
    with pytest.raises(ConfigError, match="'audio' has samples of shape"):
        bad = sample_of(2)
        bad["audio"] = bad["audio"][:, :1]
        build().single_train_step({"real": bad, "condition": LABELS[:2]}, 0)
    with pytest.raises(ConfigError, match="modality_loss_weights"):
        build(modality_loss_weights={"sound": 1.0}).single_train_step({"real": sample_of(2),
                                                                       "condition": LABELS[:2]}, 0)
    net = instantiate(two_stream_net(SHAPES, hidden=8))
    net.backbone.__class__ = SharedHead
    with pytest.raises(ValueError, match="one distinct projection per modality"):
        widen_outputs(net, 4)


# ---- LTX-2 ---------------------------------------------------------------------------------------------------
def test_ltx2_widens_each_stream_in_its_layout() -> None:
    """The tiny LTX-2 (2x2 video patches): both streams' projections widened into 3 heads give 3 predictions per
    stream, each the base network's; changing head 1's rows of the video projection changes video head 1 only,
    and of the audio projection audio head 1 only (the unpacking reads each head's channels where it sits)."""
    from fastgen.configs.net_ltx2 import TINY_LTX2_AV_DIGITS, ltx2_transformer

    torch.manual_seed(0)
    net = instantiate(ltx2_transformer(TINY_LTX2_AV_DIGITS, fps=8.0, num_prompts=4, prompt_tokens=2)).eval()
    g = torch.Generator().manual_seed(1)
    x = {"video": torch.randn(2, 1, 4, 8, 16, generator=g), "audio": torch.randn(2, 1, 8, 16, generator=g)}
    t, labels = torch.tensor([0.7, 0.3]), torch.tensor([0, 3])
    with torch.no_grad():
        for path in ("proj_out", "audio_proj_out"):  # not zero: every head's rows must matter
            net.backbone.model.get_submodule(path).weight.normal_(0, 0.1)
        base = net(x, t, condition=labels)
        projections = widen_outputs(net, 3, torch.linspace(1, 0, 4))
        assert set(projections) == {"video", "audio"}
        widened = net(x, t, condition=labels)
        for name in x:
            assert widened[name].shape == (2, 3, *x[name].shape[1:])
            for h in range(3):
                torch.testing.assert_close(widened[name][:, h], base[name], rtol=1e-4, atol=1e-5)
        for changed_stream in ("video", "audio"):
            projection = projections[changed_stream]
            saved = projection.weight.detach().clone()
            by_head = projection.by_head(saved).clone()
            by_head[1] += torch.randn_like(by_head[1])
            projection.weight.copy_(projection.from_heads(by_head))
            changed = net(x, t, condition=labels)
            projection.weight.copy_(saved)
            for name in x:
                for h in range(3):
                    if name == changed_stream and h == 1:
                        assert float((changed[name][:, h] - base[name]).abs().max()) > 1e-3
                    else:
                        torch.testing.assert_close(changed[name][:, h], base[name], rtol=1e-4, atol=1e-5)


def _ltx2_pdd_config(name: str) -> Any:
    from fastgen.configs.config_utils import load_config

    sft = load_config("LTX2/config_sft_ltx2_av_digits")
    config = create_config()
    for key in ("net", "modality_shapes", "num_classes", "sample_steps"):
        setattr(config.model, key, getattr(sft.model, key))
    config.model.teacher_ckpt = None
    config.model.grid_size = 4
    config.model.guidance_scale = 2.0
    config.model.modality_guidance_scales = {"audio": 3.0}
    config.dataloader_train = sft.dataloader_train
    config.dataloader_train.batch_size = 4
    return two_iterations(config, name, group=sft.log_config.group)


def test_ltx2_pdd_trains_two_iterations_and_samples_with_any_step_count(output_root: Path) -> None:
    """PDD on the tiny LTX-2 (``LTX2/config_sft_ltx2_av_digits``'s network and data) for 2 iterations under the
    real trainer: both streams' heads move, the checkpoint holds them with their grid, and the student samples both
    streams with 1, 2 and 4 blocks."""
    from fastgen.trainer import Trainer

    config = _ltx2_pdd_config("ltx2_pdd")
    trainer = Trainer(config)
    pdd = trainer.run()
    assert trainer.iteration == 2
    teacher = pdd.teacher.backbone.model.state_dict()
    student = pdd.net.backbone.model.state_dict()
    for path in ("proj_out", "audio_proj_out"):
        widened = student[f"{path}.weight"]
        assert widened.shape[0] == 4 * teacher[f"{path}.weight"].shape[0]
        assert not torch.equal(widened, teacher[f"{path}.weight"].repeat(4, 1)), path  # the heads trained
        torch.testing.assert_close(student[f"{path}.grid"], pdd.grid)
    for steps in (1, 2, 4):
        samples, _ = pdd.sample(2, generator=torch.Generator().manual_seed(0), steps=steps)
        assert {n: list(v.shape[1:]) for n, v in samples.items()} == {"video": [1, 8, 8, 16], "audio": [1, 8, 16]}
        assert all(torch.isfinite(v).all() for v in samples.values())
    run = output_root / "fastgen" / "audio_video_digits" / "ltx2_pdd"
    assert (run / "checkpoints" / "0000002.pth").is_file()


def test_ltx2_pdd_student_exports_to_ltx2pipeline(output_root: Path, tmp_path: Path) -> None:
    """A PDD student of a tiny LTX2Pipeline folder (2 iterations on encoded shards, the teacher guided per stream)
    exported with ``--to diffusers --steps 2``: the folder holds block 0's fused projections of both streams and
    ``pdd_blocks.safetensors`` every block's; diffusers' ``LTX2Pipeline`` with ``PDDBlockWeights`` as its step-end
    callback renders exactly fastgen's fused-block samples, video and audio (latents to 1e-4), and without the
    callback (block 0's projections throughout) it does not. ``PromptSampler`` (``fastgen sample --prompt``) draws
    the same fused-block samples."""
    from diffusers import LTX2Pipeline
    from tiny_ltx2 import FRAME_RATE, FRAMES, MAX_SEQUENCE_LENGTH, PIXELS, random_clip_shards, saved_tiny_pipeline

    from fastgen.checkpoint.run import load_run, select_net
    from fastgen.configs.data import webdataset_loader
    from fastgen.networks.codecs import load_codec
    from fastgen.pipelines.export import export_diffusers
    from fastgen.pipelines.noise import seeded
    from fastgen.pipelines.pdd_blocks import BLOCKS_FILE, FORMAT_V2, PDDBlockWeights
    from fastgen.trainer import Trainer

    folder = tmp_path / "pipeline"
    net_config = saved_tiny_pipeline(folder)
    codec = load_codec(folder, max_sequence_length=MAX_SEQUENCE_LENGTH)
    shapes = random_clip_shards(codec, ["a cat", "a dog", "the sea", "two birds"], tmp_path / "shards")

    config = create_config()
    config.model.net = net_config
    config.model.modality_shapes = shapes
    config.model.num_classes = 1  # text embeddings from the data pass through
    config.model.pretrained_model_path = str(folder)  # the teacher, and the student's start
    config.model.grid_size = 4
    config.model.guidance_scale = 2.0
    config.model.modality_guidance_scales = {"audio": 3.0}
    config.model.net_optimizer.lr = 1e-2  # two iterations that move the heads apart
    config.dataloader_train = webdataset_loader([f"WDS:{tmp_path / 'shards'}"], batch_size=4, shuffle_buffer=4, fields={
        "real.video": "latent.npy", "real.audio": "audio_latent.npy", "condition": "text.npy"})
    two_iterations(config, "ltx2_pdd_export", group="audio_video_digits")
    Trainer(config).run()
    run_dir = output_root / "fastgen" / "audio_video_digits" / "ltx2_pdd_export"

    export = tmp_path / "export"
    info = export_diffusers(str(run_dir), str(export), steps=2)
    assert info["family"] == "ltx2" and info["pdd"]["blocks"] == [2, 2]
    blocks = PDDBlockWeights(export)
    assert blocks.module_paths == {"video": "proj_out", "audio": "audio_proj_out"}
    from safetensors import safe_open

    with safe_open(str(export / BLOCKS_FILE), framework="pt") as handle:
        assert (handle.metadata() or {})["format"] == FORMAT_V2
    pipe = LTX2Pipeline.from_pretrained(export)
    pipe.set_progress_bar_config(disable=True)
    prompts = ["a red cat", "two dogs"]

    def rendered(callback: Any) -> tuple[torch.Tensor, torch.Tensor]:
        blocks.load_block(pipe, 0)
        return pipe(prompts, generator=seeded([7, 8]), height=PIXELS, width=PIXELS, num_frames=FRAMES,
                    frame_rate=FRAME_RATE, max_sequence_length=MAX_SEQUENCE_LENGTH, output_type="latent",
                    return_dict=False, callback_on_step_end=callback, **info["call"])

    theirs = rendered(blocks)
    run = load_run(str(run_dir))
    net = select_net(run, "net")
    generators = seeded([7, 8])
    noise = {name: torch.cat([torch.randn((1, *shape), generator=gen) for gen in generators])
             for name, shape in config.model.modality_shapes.items()}
    with torch.no_grad():
        ours = run.model.generate(net, noise, codec.condition(codec.encode_prompts(prompts)), blocks=[2, 2])
    torch.testing.assert_close(codec.denormalise(ours["video"]), theirs[0], atol=1e-4, rtol=0)
    torch.testing.assert_close(codec.denormalise_audio(ours["audio"]), theirs[1], atol=1e-4, rtol=0)
    # fastgen sample --prompt's path (PromptSampler: the codec's prompts, the pipeline's noise) samples the same
    from fastgen.pipelines.prompts import PromptSampler

    sampled = PromptSampler(run.model, net, "net", codec, steps=2).latents(prompts, [7, 8],
                                                                            config.model.modality_shapes)
    for name in ("video", "audio"):
        torch.testing.assert_close(sampled[name], ours[name].float(), atol=1e-5, rtol=0)
    block0 = rendered(None)  # without the swap: block 0's projections for both steps
    for name, (a, b) in {"video": (block0[0], theirs[0]), "audio": (block0[1], theirs[1])}.items():
        assert float((a - b).abs().max()) > 1e-3, name

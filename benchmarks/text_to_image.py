"""Text-to-image overheads against their bare references (issue 34's benchmarks), side by side in one process.

    .venv/bin/python benchmarks/text_to_image.py [--only sample|encode] [--rounds 7] [--json PATH]

Both run on a small random Stable-Diffusion-1.5-style pipeline of the real diffusers / transformers classes
(a 2-level ``UNet2DConditionModel`` of widths 64 / 128 with cross-attention on 32x32x4 latents, a 2-level VAE of
widths 32 / 64 for 64x64 images, a 2-layer CLIP text encoder of width 64; tokenizers built locally), saved to a
temporary folder and loaded back the way fastgen loads it. Torch runs one thread (``--threads``).

1. ``sample`` (goal <= 1.05): ``fastgen sample --prompt``'s work - ``PromptSampler.latents`` then ``.pixels``
   (encode 4 prompts, a 4-step DMD2 student's x0-then-renoise sampling with the pipeline's noise draws, VAE
   decoding, 8-bit rounding) - against ``StableDiffusionPipeline.__call__`` with the same components and the
   scheduler ``convert-ckpt --to diffusers`` writes (``LCMScheduler``, ``timesteps=[999, 749, 499, 249]``,
   ``output_type="np"``, no progress bar). Both produce the same images (checked). **Ratio = fastgen / diffusers**
   of the median of ``--rounds`` alternating rounds.
2. ``encode`` (goal >= 0.9): ``fastgen encode-data``'s work - ``encode_folder`` over 64 captioned 64x64 PNGs,
   batch 8, one shard, writing the tar, the sidecar and fsyncs - against a bare loop over the same batches that
   reads and crops the same files (``center_crop_resize``) and runs the same VAE and text encoder, writing
   nothing. **Ratio = samples/s of encode-data / samples/s of the bare loop** (medians).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

UNET = {"sample_size": 32, "in_channels": 4, "out_channels": 4, "layers_per_block": 1, "block_out_channels": [64, 128],
        "attention_head_dim": 8, "cross_attention_dim": 64, "norm_num_groups": 32,
        "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"], "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"]}
PROMPTS = ["a red cat", "a blue dog", "two birds", "the sea"]  # the local tokenizer: letters, 12 tokens
TIMES = [1.0, 0.75, 0.5, 0.25]


def build_pipeline(folder: Path) -> None:
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from tiny_pipelines import clip_tokenizer
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(0)
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(32, 64), layers_per_block=1,
                        latent_channels=4, norm_num_groups=32, sample_size=64)
    text = CLIPTextModel(CLIPTextConfig(vocab_size=54, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, max_position_embeddings=12, bos_token_id=0,
                                        eos_token_id=1, pad_token_id=1))
    StableDiffusionPipeline(vae=vae, text_encoder=text, tokenizer=clip_tokenizer(), unet=UNet2DConditionModel(**UNET),
                            scheduler=DDIMScheduler(), safety_checker=None, feature_extractor=None,
                            requires_safety_checker=False).save_pretrained(folder)


def student(folder: Path):  # noqa: ANN201 - a DMD2Model
    from fastgen.configs.experiments.Digits.config_dmd2_digits import create_config
    from fastgen.configs.instantiate import instantiate
    from fastgen.configs.net_diffusers import sd_unet

    config = create_config()
    config.model.net = sd_unet(UNET, num_prompts=1)
    config.model.teacher_ckpt = None
    config.model.pretrained_model_path = str(folder)
    config.model.input_shape = [4, 32, 32]
    config.model.t_list = TIMES
    model = instantiate(config.model_class, config=config.model)
    model.init_weights()
    return model.eval()


def median_pair(first, second, rounds: int) -> tuple[float, float, list[float], list[float]]:  # noqa: ANN001
    """Median seconds of two callables over ``rounds`` alternating rounds, and every round's seconds."""
    times: tuple[list[float], list[float]] = ([], [])
    for r in range(rounds):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        for which in order:
            start = time.perf_counter()
            (first, second)[which]()
            times[which].append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1]), times[0], times[1]


def bench_sample(folder: Path, rounds: int) -> dict[str, float]:
    from diffusers import StableDiffusionPipeline

    from fastgen.networks.codecs import load_codec
    from fastgen.pipelines.prompts import PromptSampler
    from fastgen.pipelines.schedulers import SamplingPlan, diffusers_sampling

    model = student(folder)
    sampler = PromptSampler(model, model.net, "net", load_codec(folder))
    sampling = diffusers_sampling("sd", SamplingPlan("renoise", tuple(TIMES)), model.net)
    pipe = StableDiffusionPipeline.from_pretrained(folder)
    pipe.scheduler = sampling.scheduler
    pipe.unet = model.net.backbone.model
    pipe.set_progress_bar_config(disable=True)
    seeds = list(range(len(PROMPTS)))

    def ours() -> np.ndarray:
        return sampler.pixels(sampler.latents(PROMPTS, seeds, [4, 32, 32])).numpy()

    def theirs() -> np.ndarray:
        images = pipe(PROMPTS, generator=[torch.Generator().manual_seed(s) for s in seeds], height=64, width=64,
                      output_type="np", **sampling.call).images
        return (images * 255).round().astype(np.uint8)

    with torch.no_grad():
        difference = int(np.abs(ours().astype(int) - theirs().astype(int)).max())
        fastgen_s, diffusers_s, fastgen_rounds, diffusers_rounds = median_pair(ours, theirs, rounds)
    return {"fastgen_s": fastgen_s, "diffusers_s": diffusers_s, "ratio": fastgen_s / diffusers_s,
            "max_pixel_difference": difference,
            "round_ratios": [round(a / b, 3) for a, b in zip(fastgen_rounds, diffusers_rounds)]}


def bench_encode(folder: Path, scratch: Path, rounds: int) -> dict[str, float]:
    from PIL import Image

    from fastgen.datasets.encode import captioned_images, encode_folder
    from fastgen.datasets.sources import center_crop_resize
    from fastgen.networks.codecs import load_codec

    images = scratch / "images"
    images.mkdir()
    rng = np.random.default_rng(0)
    for i in range(64):
        Image.fromarray(rng.integers(0, 256, (72, 80, 3), dtype=np.uint8)).save(images / f"{i:03d}.png")
        (images / f"{i:03d}.txt").write_text(PROMPTS[i % len(PROMPTS)])
    codec = load_codec(folder)
    sources = captioned_images(images)
    counter = iter(range(10**6))

    def ours() -> None:
        encode_folder(codec, sources, scratch / f"shards{next(counter)}", 64, shard_size=64, batch_size=8)

    def bare() -> None:
        for start in range(0, len(sources), 8):
            batch = sources[start:start + 8]
            pixels = np.stack([center_crop_resize(s.image, 64) for s in batch])
            captions = [s.image.with_suffix(".txt").read_text().strip() for s in batch]
            codec.encode_images(torch.from_numpy(pixels).permute(0, 3, 1, 2).float() / 127.5 - 1)
            codec.encode_prompts(captions)

    with torch.no_grad():
        fastgen_s, bare_s, fastgen_rounds, bare_rounds = median_pair(ours, bare, rounds)
    return {"encode_data_samples_per_s": 64 / fastgen_s, "bare_loop_samples_per_s": 64 / bare_s,
            "ratio": bare_s / fastgen_s, "round_ratios": [round(b / a, 3) for a, b in zip(fastgen_rounds, bare_rounds)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("sample", "encode"))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    scratch = Path(tempfile.mkdtemp(prefix="fastgen_t2i_bench_"))
    try:
        folder = scratch / "pipeline"
        build_pipeline(folder)
        results = {}
        if args.only in (None, "sample"):
            results["sample"] = bench_sample(folder, args.rounds)
            print("sample --prompt / diffusers pipeline:", json.dumps(results["sample"]))
        if args.only in (None, "encode"):
            results["encode"] = bench_encode(folder, scratch, args.rounds)
            print("encode-data / bare loop (samples/s):", json.dumps(results["encode"]))
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()

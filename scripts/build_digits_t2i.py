"""Build the digits text-to-image pipeline that ships as ``fastgen/assets/digits_t2i`` (a few MB): a small VAE, a
small CLIP text encoder and a teacher U-Net, all trained here on scikit-learn's 8x8 digits, as a diffusers
``StableDiffusionPipeline`` folder - prompts like "a handwritten seven".

    .venv/bin/python scripts/build_digits_t2i.py --work /tmp/digits_t2i [--out fastgen/assets/digits_t2i]

1. **VAE** (``AutoencoderKL``, widths 32 / 64, 4 latent channels): 8x8 RGB digits (grey) -> 4x4x4 latents; L2
   reconstruction + 1e-6 KL, Adam; ``scaling_factor`` = 1 / the latents' standard deviation (Rombach et al. 2022,
   Sec. 4.3.2).
2. **Text encoder** (``CLIPTextModel``, width 32, 2 layers; a character-level ``CLIPTokenizer`` built here):
   trained to tell the digit a prompt names from its pooled output (a linear head, dropped after), over
   templates ("a handwritten seven", "the digit 7", "number seven", ...), so prompts that name one digit in
   different words land close together.
3. **Teacher**: fastgen's own workflow - ``fastgen encode-data`` of the digits as captioned PNGs (3 captions each)
   through the folder above, then ``fastgen train -c Digits/config_sft_t2i_digits`` (a ``UNet2DConditionModel`` on
   SD's discrete VP schedule, epsilon prediction), then ``fastgen convert-ckpt --to diffusers --only ema``.
4. ``prompts.safetensors``: "a handwritten zero" ... "a handwritten nine" encoded by the text encoder, the prompt
   bank with which ``Digits/config_dmd2_t2i_digits`` distills the teacher on the digits' labels.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
TEMPLATES = ["a handwritten {w}", "the digit {w}", "number {w}", "a {w}", "the digit {d}", "a handwritten {d}",
             "{w}", "a drawing of a {w}"]
PROMPT = "a handwritten {w}"
MAX_TOKENS = 24
LATENT_CHANNELS = 4


def caption(label: int, rng: np.random.Generator) -> str:
    return TEMPLATES[int(rng.integers(len(TEMPLATES)))].format(w=WORDS[label], d=label)


def tokenizer():  # noqa: ANN201 - a CLIPTokenizer
    """Characters (a-z, 0-9) as tokens, with CLIP's end-of-word forms; no merges."""
    from transformers import CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in "abcdefghijklmnopqrstuvwxyz0123456789":
        vocab[c] = len(vocab)
        vocab[c + "</w>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=MAX_TOKENS)


def digits() -> tuple[np.ndarray, np.ndarray]:
    from fastgen.datasets.sources import digits_split

    pixels, labels = digits_split("train")
    return np.repeat(pixels[..., None], 3, axis=-1), labels  # (N, 8, 8, 3) grey RGB


def train_vae(pixels: np.ndarray, steps: int) -> torch.nn.Module:
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(32, 64), layers_per_block=1,
                        latent_channels=LATENT_CHANNELS, norm_num_groups=16, sample_size=8)
    x_all = torch.from_numpy(pixels).permute(0, 3, 1, 2).float() / 127.5 - 1
    optimizer = torch.optim.Adam(vae.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    for step in range(steps):
        x = x_all[torch.randint(len(x_all), (128,), generator=generator)]
        posterior = vae.encode(x).latent_dist
        recon = vae.decode(posterior.sample(generator=generator)).sample
        loss = (recon - x).square().mean() + 1e-6 * posterior.kl().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 500 == 0 or step == steps - 1:
            print(f"vae {step}: loss {loss.item():.4f}", flush=True)
    vae.eval()
    with torch.no_grad():
        std = float(vae.encode(x_all).latent_dist.mode().std())
    vae.register_to_config(scaling_factor=1.0 / std)
    print(f"vae latent std {std:.4f} -> scaling_factor {1.0 / std:.4f}", flush=True)
    return vae


def train_text_encoder(steps: int) -> torch.nn.Module:
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(0)
    tok = tokenizer()
    model = CLIPTextModel(CLIPTextConfig(vocab_size=len(tok.get_vocab()), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=MAX_TOKENS,
                                         bos_token_id=0, eos_token_id=1, pad_token_id=1))
    head = torch.nn.Linear(32, 10)
    optimizer = torch.optim.Adam([*model.parameters(), *head.parameters()], lr=1e-3)
    rng = np.random.default_rng(0)
    for step in range(steps):
        labels = rng.integers(10, size=64)
        ids = tok([caption(int(y), rng) for y in labels], padding="max_length", max_length=MAX_TOKENS,
                  truncation=True, return_tensors="pt").input_ids
        logits = head(model(ids).pooler_output)
        loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(labels))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 200 == 0 or step == steps - 1:
            accuracy = (logits.argmax(1).numpy() == labels).mean()
            print(f"text encoder {step}: loss {loss.item():.4f} accuracy {accuracy:.3f}", flush=True)
    return model.eval()


def write_prompt_bank(folder: Path) -> None:
    """``prompts.safetensors``: the ten digit prompts encoded by the folder's text encoder (and ``prompts.json``)."""
    from safetensors.torch import save_file

    from fastgen.networks.codecs import load_codec

    prompts = [PROMPT.format(w=w) for w in WORDS]
    bank = load_codec(folder).encode_prompts(prompts)["text"].contiguous()
    save_file({"prompts": bank}, str(folder / "prompts.safetensors"))
    (folder / "prompts.json").write_text(json.dumps(prompts, indent=1) + "\n")


def fastgen(*args: str) -> None:
    from fastgen.cli.main import main

    print("$ fastgen " + " ".join(args), flush=True)
    try:
        main(list(args))
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "fastgen/assets/digits_t2i")
    parser.add_argument("--vae-steps", type=int, default=3000)
    parser.add_argument("--text-steps", type=int, default=1500)
    parser.add_argument("--teacher-iters", type=int, default=6000)
    args = parser.parse_args()
    from diffusers import DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from fastgen.configs.experiments.Digits.config_sft_t2i_digits import TEACHER_UNET

    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    pixels, labels = digits()
    base = work / "base"
    if not (base / "model_index.json").is_file():
        vae = train_vae(pixels, args.vae_steps)
        text = train_text_encoder(args.text_steps)
        torch.manual_seed(0)
        StableDiffusionPipeline(
            vae=vae, text_encoder=text, tokenizer=tokenizer(), unet=UNet2DConditionModel(**TEACHER_UNET),
            scheduler=DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                    clip_sample=False, set_alpha_to_one=False, steps_offset=1),
            safety_checker=None, feature_extractor=None, requires_safety_checker=False).save_pretrained(base)
        write_prompt_bank(base)

    images = work / "captioned"
    if not images.is_dir():
        from PIL import Image

        images.mkdir()
        rng = np.random.default_rng(1)
        for i, (image, label) in enumerate(zip(pixels, labels)):
            for copy in range(3):
                Image.fromarray(image).save(images / f"{i:04d}_{copy}.png")
                (images / f"{i:04d}_{copy}.txt").write_text(caption(int(label), rng))
    shards = work / "shards"
    fastgen("encode-data", str(images), str(shards), "--weights", str(base), "--resolution", "8",
            "--batch-size", "256", "--device", "cpu")

    os.environ["FASTGEN_OUTPUT_ROOT"] = str(work / "runs")
    os.environ.setdefault("WANDB_MODE", "disabled")
    fastgen("train", "-c", "Digits/config_sft_t2i_digits", "-", f"model.pretrained_model_path={base}",
            f"model.net.backbone.prompt_embeddings={base / 'prompts.safetensors'}",
            f"dataloader_train.datatags=[WDS:{shards}]", f"trainer.max_iter={args.teacher_iters}",
            "log_config.name=teacher")
    run = work / "runs" / "fastgen" / "digits" / "teacher"
    staged = work / "export"
    shutil.rmtree(staged, ignore_errors=True)
    fastgen("convert-ckpt", str(run), str(staged), "--to", "diffusers", "--only", "ema")

    write_prompt_bank(staged)
    shutil.rmtree(args.out, ignore_errors=True)
    shutil.copytree(staged, args.out)
    print(f"wrote {args.out}: {sum(f.stat().st_size for f in args.out.rglob('*') if f.is_file()) / 2**20:.1f} MiB")


if __name__ == "__main__":
    sys.exit(main())

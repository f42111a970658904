"""``fastgen eval`` of a ``sample --prompt`` folder (issue 34, point 6): the CLIP score of a tiny random CLIP of the
real transformers classes equals CLIP's own image-text logits (the model's forward, a different code path), and
the FID is 0 against the samples themselves and grows for other images; usage errors are one line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from fastgen_testing import run_in_process as fastgen
from PIL import Image
from tiny_pipelines import clip_tokenizer

PROMPTS = ["a red cat", "two dogs", "a blue sea", "one bird"]


def images(seed: int, n: int = 4) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 16, 16, 3), dtype=np.uint8)


def prompt_folder(folder: Path, pixels: np.ndarray) -> Path:
    folder.mkdir()
    records = []
    for i, (image, prompt) in enumerate(zip(pixels, PROMPTS)):
        Image.fromarray(image).save(folder / f"{i:04d}.png")
        records.append({"file": f"{i:04d}.png", "prompt": prompt, "seed": i})
    (folder / "samples.json").write_text(json.dumps(records))
    return folder


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    torch.manual_seed(0)
    config = CLIPConfig(
        text_config={"vocab_size": 54, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "max_position_embeddings": 12, "bos_token_id": 0, "eos_token_id": 1,
                     "pad_token_id": 1},
        vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": 16, "patch_size": 8},
        projection_dim=8)
    folder = tmp_path_factory.mktemp("clip") / "clip"
    CLIPModel(config).eval().save_pretrained(folder)
    clip_tokenizer().save_pretrained(folder)
    CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16}).save_pretrained(folder)
    return folder


def test_clip_score_is_clips_own_image_text_cosine(clip_folder: Path, tmp_path: Path) -> None:
    from transformers import CLIPImageProcessor, CLIPModel

    samples = prompt_folder(tmp_path / "samples", images(1))
    report = tmp_path / "report.json"
    result = fastgen("eval", str(samples), "--clip-model", str(clip_folder), "--json", str(report))
    assert result.returncode == 0, result.stderr
    assert "clip_score" in result.stdout
    metrics = json.loads(report.read_text())["metrics"]
    assert metrics["num_samples"] == 4 and "fid" not in metrics

    model = CLIPModel.from_pretrained(clip_folder).eval()
    processor = CLIPImageProcessor.from_pretrained(clip_folder)
    tokens = clip_tokenizer()(PROMPTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask,
                    pixel_values=processor(images=list(images(1)), return_tensors="pt")["pixel_values"])
    cosine = out.logits_per_image.diagonal() / model.logit_scale.exp()
    assert metrics["clip_score"] == pytest.approx(float((100 * cosine.clamp(min=0)).mean()), rel=1e-4, abs=1e-4)


def test_fid_against_a_reference_folder(tmp_path: Path) -> None:
    from fastgen.evaluation.inception import FIDInceptionV3

    torch.manual_seed(0)
    model = FIDInceptionV3()
    for module in model.modules():
        if isinstance(module, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
    weights = tmp_path / "inception.pth"
    torch.save({k: v for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}, weights)

    samples = prompt_folder(tmp_path / "samples", images(1))
    same, other = tmp_path / "same", tmp_path / "other"
    for folder, pixels in ((same, images(1)), (other, np.clip(images(2).astype(int) // 4, 0, 255).astype(np.uint8))):
        folder.mkdir()
        for i, image in enumerate(pixels):
            Image.fromarray(image).save(folder / f"{i}.png")
    scores = {}
    for name, reference in (("same", same), ("other", other)):
        result = fastgen("eval", str(samples), "--ref-stats", str(reference), "--inception-weights", str(weights),
                         "--json", str(tmp_path / f"{name}.json"))
        assert result.returncode == 0, result.stderr
        scores[name] = json.loads((tmp_path / f"{name}.json").read_text())["metrics"]["fid"]
    assert abs(scores["same"]) < 1e-3 < scores["other"]


def test_text_to_image_eval_errors_are_one_line(clip_folder: Path, tmp_path: Path) -> None:
    samples = prompt_folder(tmp_path / "samples", images(1))

    def one_line(result: subprocess.CompletedProcess, fragment: str) -> None:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2 and len(lines) == 1 and fragment in lines[0], result.stderr

    one_line(fastgen("eval", str(samples)), "give at least one")
    one_line(fastgen("eval", str(samples), "--clip-model", str(tmp_path)), "not a transformers model folder")
    (samples / "samples.json").write_text(json.dumps([{"file": "../x.png", "prompt": "a"}]))
    one_line(fastgen("eval", str(samples), "--clip-model", str(clip_folder)), "is not a PNG in the folder")
    npz = tmp_path / "digits.npz"
    np.savez(npz, arr_0=np.zeros((2, 8, 8, 1), np.uint8))
    one_line(fastgen("eval", str(npz), "--clip-model", str(clip_folder)), "--clip-model scores text-to-image")

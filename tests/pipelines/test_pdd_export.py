"""A PDD student of a diffusers family end to end (issue 37): a tiny random Flux pipeline of the real classes ->
``fastgen encode-data`` -> 2 PDD iterations (the real Trainer, the Flux transformer's ``proj_out`` widened into 4
heads) -> ``fastgen sample --prompt --steps K`` -> ``fastgen convert-ckpt --to diffusers --steps K`` -> diffusers'
``FluxPipeline`` renders what fastgen sampled, with ``PDDBlockWeights`` swapping each block's fused projection in
(and a one-block export is a stock pipeline with no callback at all)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fastgen_testing import run_in_process as fastgen
from fastgen_testing import two_iterations
from PIL import Image
from tiny_pipelines import tiny_family_pipeline

from fastgen.configs.net_diffusers import TINY_FLUX, flux_transformer

CAPTIONS = ["a red cat", "a blue dog", "two birds", "a green frog"]
PROMPTS = ["a red cat", "two dogs at night"]
SEEDS = [5, 6]


@pytest.fixture(scope="module")
def pdd_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:

    from fastgen.configs.callbacks import EMA_CALLBACK
    from fastgen.configs.data import webdataset_loader
    from fastgen.configs.instantiate import instantiate
    from fastgen.configs.methods.config_pdd import create_config
    from fastgen.trainer import Trainer

    root = tmp_path_factory.mktemp("pdd_flux")
    torch.manual_seed(0)
    weights = root / "pipeline"
    tiny_family_pipeline("flux", instantiate(flux_transformer(TINY_FLUX)).backbone.model).save_pretrained(weights)
    photos = root / "photos"
    photos.mkdir()
    rng = np.random.default_rng(1)
    for i, caption in enumerate(CAPTIONS):
        Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(photos / f"{i}.png")
        (photos / f"{i}.txt").write_text(caption)
    shards = root / "shards"
    encoded = fastgen("encode-data", str(photos), str(shards), "--weights", str(weights), "--resolution", "16",
                      "--device", "cpu")
    assert encoded.returncode == 0, encoded.stderr[-2000:]
    config = create_config()
    config.model.net = flux_transformer(TINY_FLUX, num_prompts=1)
    config.model.num_classes = 1
    config.model.pretrained_model_path = str(weights)
    config.model.input_shape = [1, 8, 8]
    config.model.grid_size = 4
    config.model.inference_blocks = [2, 2]
    config.model.use_ema = True
    config.model.net_optimizer.lr = 1e-2  # two iterations that move the heads apart
    config.dataloader_train = webdataset_loader([f"WDS:{shards}"], batch_size=4, shuffle_buffer=4,
                                                fields={"real": "latent.npy", "condition": "text.npy"})
    two_iterations(config, "pdd_flux", group="t2i", callbacks=EMA_CALLBACK)
    config.trainer.callbacks.ema.beta = 0.0  # the EMA network is the trained one
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FASTGEN_OUTPUT_ROOT", str(root / "runs"))
        mp.setenv("WANDB_MODE", "disabled")
        Trainer(config).run()
        run = Path(config.log_config.save_path)
    return {"run": run, "weights": weights}


def rendered(folder: Path, call: dict[str, Any], callback: Any = None) -> np.ndarray:
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    extra = {} if callback is None else {"callback_on_step_end": callback}
    out = pipe(PROMPTS, generator=[torch.Generator().manual_seed(s) for s in SEEDS], height=16, width=16,
               output_type="np", **call, **extra)
    return (out.images * 255).round().astype(np.uint8)


def sampled(run: Path, out: Path, steps: int) -> np.ndarray:
    result = fastgen("sample", str(run), "--ema", "--prompt", PROMPTS[0], "--prompt", PROMPTS[1], "--seed", "5",
                     "--steps", str(steps), "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    with Image.open(out / "0000.png") as a, Image.open(out / "0001.png") as b:
        return np.stack([np.asarray(a.convert("RGB")), np.asarray(b.convert("RGB"))])


def test_heads_are_widened_and_trained_apart(pdd_run: dict[str, Any]) -> None:
    from fastgen.checkpoint.run import load_run
    from fastgen.networks.heads import head_projection_of

    model = load_run(pdd_run["run"]).model
    projection = head_projection_of(model.ema_nets["ema"])
    assert projection is not None and projection.heads == 4 and projection.spec.path == "model.proj_out"
    heads = projection.by_head(projection.weight.detach())
    assert float((heads[0] - heads[3]).abs().max()) > 1e-4  # trained apart (they start equal)
    assert float(projection.grid[0]) == 1.0  # Flux's rectified flow: the grid starts at pure noise


@pytest.mark.parametrize("steps", [2, 1])
def test_the_exported_pipeline_renders_what_fastgen_sampled(pdd_run: dict[str, Any], tmp_path: Path,
                                                           steps: int) -> None:
    ours = sampled(pdd_run["run"], tmp_path / "samples", steps)
    export = tmp_path / "export"
    exported = fastgen("convert-ckpt", str(pdd_run["run"]), str(export), "--to", "diffusers", "--steps", str(steps))
    assert exported.returncode == 0, exported.stderr[-2000:]
    info = json.loads((export / "fastgen_export.json").read_text())
    assert info["pdd"]["blocks"] == ([2, 2] if steps == 2 else [4]) and info["sampler"] == "ode"
    assert info["times"] == ([1.0, 0.5] if steps == 2 else [1.0])
    assert "PDDBlockWeights" in (export / "README.md").read_text()
    from fastgen.pipelines.pdd_blocks import PDDBlockWeights

    theirs = rendered(export, info["call"], PDDBlockWeights(export))
    difference = np.abs(theirs.astype(int) - ours.astype(int))
    assert difference.max() <= 2, difference.max()
    if steps == 1:  # one block: the stock pipeline is the student, no callback needed
        assert np.abs(rendered(export, info["call"]).astype(int) - ours.astype(int)).max() <= 2
    else:  # several: without the callback every step would use block 0's projection, and the images differ
        without = rendered(export, info["call"])
        assert np.abs(without.astype(int) - ours.astype(int)).max() > 2


def test_the_step_count_changes_the_samples_from_one_student(pdd_run: dict[str, Any], tmp_path: Path) -> None:
    one, two = sampled(pdd_run["run"], tmp_path / "one", 1), sampled(pdd_run["run"], tmp_path / "two", 2)
    assert np.abs(one.astype(int) - two.astype(int)).max() > 0

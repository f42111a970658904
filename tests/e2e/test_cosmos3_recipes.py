"""Cosmos 3's recipes (``Cosmos3/``): without their weights folder ``fastgen train`` is one line naming
``model.pretrained_model_path``, then one naming the prompt file; and the family at toy size as the real recipes
run it - 2 ranks through the real launcher, FSDP2 over the decoder layers after a meta-device build, activation
checkpointing, DMD2 from a pipeline folder whose tokenizer makes the null condition on every rank. (Loading,
validation and dry runs of the recipes: tests/configs/test_recipes.py; the network against the diffusers
pipeline: tests/networks/test_cosmos3.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastgen_testing import run_cli

RECIPES = ("Cosmos3/config_sft_cosmos3", "Cosmos3/config_dmd2_cosmos3")


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_cosmos3_recipe_names_its_missing_weights_then_its_missing_prompts(recipe: str, output_root: Path,
                                                                            tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "cosmos3_nano_latents").mkdir(parents=True)
    env = {"DATA_ROOT_DIR": str(data)}
    result = run_cli("train", "--config", recipe, cwd=tmp_path, env=env)
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(errors) == 1, result.stderr[-2000:]
    assert "model.pretrained_model_path" in errors[0] and str(data / "weights" / "cosmos3_nano") in errors[0], errors
    (data / "weights" / "cosmos3_nano").mkdir(parents=True)
    result = run_cli("train", "--config", recipe, cwd=tmp_path, env=env)
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(errors) == 1, result.stderr[-2000:]
    assert "prompt_embeddings" in errors[0] and "cosmos3_nano_prompts.safetensors" in errors[0], errors
    assert not (output_root / "fastgen").exists()


TINY_RECIPE = '''
from fastgen.configs.experiments.Digits.config_dmd2_digits import create_config as dmd2_digits
from fastgen.configs.net_cosmos3 import TINY_COSMOS3, cosmos3_transformer


def create_config():
    config = dmd2_digits()
    config.model.net = cosmos3_transformer(TINY_COSMOS3, num_prompts=10, prompt_tokens=3, temporal_compression=2,
                                           spatial_compression=2)
    config.model.teacher_ckpt = None
    config.model.pretrained_model_path = {folder!r}
    config.model.gan_loss_weight_gen = 1e-2
    config.model.guidance_scale = 2.0
    config.trainer.callbacks = {{}}
    config.dataloader_val = None
    config.log_config.name = "tiny_cosmos3"
    return config
'''


@pytest.mark.slow
def test_two_ranks_distil_a_tiny_cosmos3_sharded_after_a_meta_build(output_root: Path, tmp_path: Path) -> None:
    """DMD2 of the tiny Cosmos 3 on 2 gloo ranks: FSDP2 over its decoder layers, a meta-device build (rank 0 reads
    the pipeline folder and broadcasts), activation checkpointing, the GAN head on the teacher's feature taps, the
    teacher guided against the null condition (the pipeline's negative prompt, tokenised on each rank from the
    folder's ``text_tokenizer/`` that ``model.pretrained_model_path`` hands the network). The teacher is exactly the
    folder's weights (the checkpoint's fingerprint of it); the student trained; its frozen parts did not move."""
    import torch
    from multirank import fastgen
    from safetensors.torch import load_file
    from tiny_cosmos3 import cosmos3_pipeline, tiny_transformer

    from fastgen.checkpoint.checkpointer import load_checkpoint
    from fastgen.configs.config_utils import load_config
    from fastgen.configs.instantiate import instantiate
    from fastgen.configs.net_cosmos3 import TINY_COSMOS3
    from fastgen.distributed.fingerprint import network_fingerprint

    folder = tmp_path / "pipeline"
    cosmos3_pipeline(tiny_transformer(TINY_COSMOS3, seed=3)).save_pretrained(folder)
    recipe = tmp_path / "tiny_cosmos3.py"
    recipe.write_text(TINY_RECIPE.format(folder=str(folder)))
    result = fastgen("train", "--nproc-per-node", "2", "-c", str(recipe), "--eval-samples", "0", "-",
                     "trainer.fsdp=True", "model.meta_init=True", "model.activation_checkpointing=True",
                     "trainer.max_iter=2", "trainer.save_ckpt_iter=2", "dataloader_train.batch_size=4",
                     "model.student_update_freq=2", cwd=tmp_path, env={"WANDB_MODE": "disabled"}, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    run = output_root / "fastgen" / "digits" / "tiny_cosmos3"
    payload = load_checkpoint(str(run / "checkpoints" / "0000002.pth"))
    assert "teacher" not in payload["model"]
    assert load_config(str(run / "config.yaml")).model.net.backbone.tokenizer == str(folder)
    config = load_config(str(recipe))
    teacher = instantiate(config.model.net)
    teacher.backbone.load_pretrained(str(folder))
    assert network_fingerprint(teacher) == payload["frozen_fingerprints"]["teacher"]
    saved = load_file(str(folder / "transformer" / "diffusion_pytorch_model.safetensors"))
    student = {k.removeprefix("backbone.model."): v for k, v in payload["model"]["net"].items()
               if k.startswith("backbone.model.")}
    assert student.keys() == saved.keys()
    frozen = {n for n, p in teacher.backbone.model.named_parameters() if not p.requires_grad}
    assert frozen and all(torch.equal(student[k], saved[k]) for k in frozen)
    assert any(not torch.equal(student[k], saved[k]) for k in saved if k not in frozen)

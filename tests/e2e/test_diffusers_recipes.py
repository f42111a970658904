"""The recipes for real diffusers-backed models (``SD/`` 1.5 and XL, ``Flux/``, ``Wan/``, ``QwenImage/``,
``CogVideoX/``, ``LTX2/``, ``CosmosPredict2/``): without
their weights folder ``fastgen train`` is one line naming ``model.pretrained_model_path`` (exit 2, no run
directory); with it but without the encoded prompts, one line naming that file. (Loading, validation, dry runs and config.yaml
round-trips of every recipe: tests/configs/test_recipes.py; the networks themselves, trained on digits from
tiny configs: tests/networks/test_diffusers_nets.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastgen_testing import run_cli

RECIPES = {"SD/config_dmd2_sd15": "sd15", "SD/config_dmd2_sdxl": "sdxl", "SD/config_sft_sdxl": "sdxl",
           "Flux/config_dmd2_flux": "flux1_dev", "Wan/config_dmd2_wan": "wan21_t2v_1_3b",
           "QwenImage/config_dmd2_qwenimage": "qwen_image", "QwenImage/config_sft_qwenimage": "qwen_image",
           "CogVideoX/config_dmd2_cogvideox": "cogvideox_5b", "CogVideoX/config_sft_cogvideox": "cogvideox_5b",
           "LTX2/config_sft_ltx2": "ltx2_19b", "LTX2/config_dmd2_ltx2": "ltx2_19b",
           "CosmosPredict2/config_dmd2_cosmos_predict2": "cosmos_predict2_2b",
           "CosmosPredict2/config_sft_cosmos_predict2": "cosmos_predict2_2b",
           "CosmosPredict2/config_sft_cosmos_predict2_video2world": "cosmos_predict2_2b_v2w",
           "CosmosPredict2/config_dmd2_cosmos_predict2_video2world": "cosmos_predict2_2b_v2w",
           "CosmosPredict2/config_sft_cosmos_predict25": "cosmos_predict25_2b",
           "CosmosPredict2/config_dmd2_cosmos_predict25": "cosmos_predict25_2b"}


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_a_real_model_recipe_names_its_missing_weights_then_its_missing_prompts(recipe: str, output_root: Path,
                                                                                tmp_path: Path) -> None:
    name = RECIPES[recipe]
    data = tmp_path / "data"
    (data / f"{name}_latents").mkdir(parents=True)
    env = {"DATA_ROOT_DIR": str(data)}
    result = run_cli("train", "--config", recipe, cwd=tmp_path, env=env)
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(errors) == 1, result.stderr[-2000:]
    assert "model.pretrained_model_path" in errors[0] and str(data / "weights" / name) in errors[0], errors
    (data / "weights" / name).mkdir(parents=True)
    result = run_cli("train", "--config", recipe, cwd=tmp_path, env=env)
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(errors) == 1, result.stderr[-2000:]
    assert "prompt_embeddings" in errors[0] and f"{name}_prompts.safetensors" in errors[0], errors
    assert not (output_root / "fastgen").exists()


TINY_RECIPE = '''
from fastgen.configs.experiments.Digits.config_dmd2_digits import create_config as dmd2_digits
from fastgen.configs.{module} import {tiny}, {build}


def create_config():
    config = dmd2_digits()
    config.model.net = {build}({tiny}, num_prompts=10)
    config.model.teacher_ckpt = None
    config.model.pretrained_model_path = {folder!r}
    config.model.gan_loss_weight_gen = 1e-2
    config.trainer.callbacks = {{}}
    config.dataloader_val = None
    config.log_config.name = "tiny_{family}"
    return config
'''
# family: (network builder, its tiny config, the pipeline folder's subfolder, the fastgen.configs module of both)
TINY_FAMILIES = {"flux": ("flux_transformer", "TINY_FLUX", "transformer", "net_diffusers"),
                 "sdxl": ("sdxl_unet", "TINY_SDXL_UNET", "unet", "net_diffusers"),
                 "qwenimage": ("qwenimage_transformer", "TINY_QWEN_IMAGE", "transformer", "net_diffusers"),
                 "cogvideox": ("cogvideox_transformer", "TINY_COGVIDEOX", "transformer", "net_diffusers"),
                 "cosmos2": ("cosmos_predict2_transformer", "TINY_COSMOS_PREDICT2", "transformer",
                             "net_cosmos_predict2"),
                 "cosmos25": ("cosmos_predict25_transformer", "TINY_COSMOS_PREDICT25", "transformer",
                              "net_cosmos_predict25")}


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(TINY_FAMILIES))
def test_two_ranks_distil_a_tiny_model_from_its_weights_folder_sharded_after_a_meta_build(family: str, output_root: Path,
                                                                                          tmp_path: Path) -> None:
    """What the real recipes do, at toy size: 2 ranks, FSDP2 over the Flux blocks, a meta-device build (rank 0
    reads the diffusers folder and broadcasts), activation checkpointing, DMD2 with the GAN head. The teacher the
    run trained with is exactly the folder's weights: the final checkpoint's fingerprint of it (the checkpoint
    leaves the frozen teacher out) is that of a network loaded from the folder in this process."""
    import importlib

    import torch
    from multirank import fastgen
    from safetensors.torch import load_file

    from fastgen.checkpoint.checkpointer import load_checkpoint
    from fastgen.configs.instantiate import instantiate

    build, tiny, subfolder, module = TINY_FAMILIES[family]
    configs = importlib.import_module(f"fastgen.configs.{module}")
    torch.manual_seed(3)
    source = instantiate(getattr(configs, build)(getattr(configs, tiny))).backbone.model
    source.save_pretrained(tmp_path / "pipeline" / subfolder)
    recipe = tmp_path / f"tiny_{family}.py"
    recipe.write_text(TINY_RECIPE.format(folder=str(tmp_path / "pipeline"), build=build, tiny=tiny, family=family,
                                         module=module))
    result = fastgen("train", "--nproc-per-node", "2", "-c", str(recipe), "--eval-samples", "0", "-",
                     "trainer.fsdp=True", "model.meta_init=True", "model.activation_checkpointing=True",
                     "trainer.max_iter=4", "trainer.save_ckpt_iter=4", "dataloader_train.batch_size=8",
                     "model.student_update_freq=2", cwd=tmp_path, env={"WANDB_MODE": "disabled"}, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = load_file(str(tmp_path / "pipeline" / subfolder / "diffusion_pytorch_model.safetensors"))
    payload = load_checkpoint(str(output_root / "fastgen" / "digits" / f"tiny_{family}" / "checkpoints" / "0000004.pth"))
    assert "teacher" not in payload["model"]
    from fastgen.configs.config_utils import load_config
    from fastgen.distributed.fingerprint import network_fingerprint

    teacher = instantiate(load_config(str(recipe)).model.net)
    teacher.backbone.load_pretrained(str(tmp_path / "pipeline"))
    assert network_fingerprint(teacher) == payload["frozen_fingerprints"]["teacher"]
    student = {k.removeprefix("backbone.model."): v for k, v in payload["model"]["net"].items()
               if k.startswith("backbone.model.")}
    assert student.keys() == saved.keys() and any(not torch.equal(student[k], saved[k]) for k in saved)


PDD_RECIPE = '''
from fastgen.configs.experiments.Digits.config_pdd_digits import create_config as pdd_digits
from fastgen.configs.net_diffusers import TINY_FLUX, flux_transformer


def create_config():
    config = pdd_digits()
    config.model.net = flux_transformer(TINY_FLUX, num_prompts=10)
    config.model.teacher_ckpt = None
    config.model.pretrained_model_path = {folder!r}
    config.model.grid_size = 4
    config.model.inference_blocks = [2, 2]
    config.trainer.callbacks = {{}}
    config.model.use_ema = False
    config.dataloader_val = None
    config.log_config.name = "tiny_pdd_flux"
    return config
'''


@pytest.mark.slow
def test_two_ranks_train_a_pdd_student_sharded_after_a_meta_build(output_root: Path, tmp_path: Path) -> None:
    """PDD on 2 ranks, FSDP2 over the Flux blocks after a meta-device build: the student's ``proj_out`` is widened
    into 4 heads on every rank (rank 0's real build, teacher weights repeated into each head, broadcast into the
    shards), the heads train, and the checkpoint holds the widened projection with its grid."""
    import torch
    from multirank import fastgen

    from fastgen.checkpoint.checkpointer import load_checkpoint
    from fastgen.configs import net_diffusers
    from fastgen.configs.instantiate import instantiate

    torch.manual_seed(3)
    source = instantiate(net_diffusers.flux_transformer(net_diffusers.TINY_FLUX)).backbone.model
    source.save_pretrained(tmp_path / "pipeline" / "transformer")
    recipe = tmp_path / "tiny_pdd_flux.py"
    recipe.write_text(PDD_RECIPE.format(folder=str(tmp_path / "pipeline")))
    result = fastgen("train", "--nproc-per-node", "2", "-c", str(recipe), "--eval-samples", "0", "-",
                     "trainer.fsdp=True", "model.meta_init=True", "trainer.max_iter=3", "trainer.save_ckpt_iter=3",
                     "dataloader_train.batch_size=8", cwd=tmp_path, env={"WANDB_MODE": "disabled"}, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    payload = load_checkpoint(str(output_root / "fastgen" / "digits" / "tiny_pdd_flux" / "checkpoints" / "0000003.pth"))
    net = payload["model"]["net"]
    base = source.proj_out.weight.detach()
    widened = net["backbone.model.proj_out.weight"]
    assert widened.shape == (4 * base.shape[0], base.shape[1])
    torch.testing.assert_close(net["backbone.model.proj_out.grid"], torch.linspace(1, 0, 5, dtype=torch.float64))
    assert not torch.equal(widened, base.repeat(4, 1))  # the heads trained (they start as four copies)
    assert float((widened - base.repeat(4, 1)).abs().max()) < 1.0

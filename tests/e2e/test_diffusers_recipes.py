"""The recipes for real diffusers-backed models (``SD/``, ``Flux/``, ``Wan/``): without their weights folder
``fastgen train`` is one line naming ``model.pretrained_model_path`` (exit 2, no run directory); with it but
without the encoded prompts, one line naming that file. (Loading, validation, dry runs and config.yaml
round-trips of every recipe: tests/configs/test_recipes.py; the networks themselves, trained on digits from
tiny configs: tests/networks/test_diffusers_nets.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastgen_testing import run_cli

RECIPES = {"SD/config_dmd2_sd15": "sd15", "Flux/config_dmd2_flux": "flux1_dev", "Wan/config_dmd2_wan": "wan21_t2v_1_3b"}


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

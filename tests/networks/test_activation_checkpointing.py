"""``model.activation_checkpointing``: every block of the trained networks recomputes its activations in backward.
Training is unchanged (the same weights after the same steps, the same checkpoint keys), the traced training peak
drops, and frozen networks are left alone. The 2-rank FSDP2 composition is tests/networks/test_dit.py's
``test_two_ranks_train_the_sft_dit_recipe_with_activation_checkpointing``."""

from __future__ import annotations

import pytest
import torch

from fastgen.trainer import Trainer


def _config(recipe: str, checkpointed: bool, name: str):
    from fastgen.configs.config_utils import load_config

    config = load_config(recipe)
    config.model.activation_checkpointing = checkpointed
    if "model_channels" in config.model.net.backbone:
        config.model.net.backbone.model_channels = 8
    config.dataloader_train.batch_size = 16
    config.dataloader_val = None
    config.trainer.max_iter = 3
    config.trainer.save_ckpt_iter = 1000
    config.trainer.callbacks = {}
    config.log_config.wandb_mode = "disabled"
    config.log_config.name = name
    config.trainer.resume = False
    if "dmd2" in recipe:  # DMD2 with its GAN head, every optimizer stepping within 3 iterations
        config.model.teacher_ckpt = None
        config.model.gan_loss_weight_gen = 1e-2
        config.model.student_update_freq = 2
    return config


@pytest.mark.parametrize("recipe", ["Digits/config_sft_dit_digits", "Digits/config_sft_digits",
                                    "Digits/config_dmd2_dit_digits"])
def test_checkpointed_training_ends_with_the_same_weights(recipe: str) -> None:
    """The same weights after 3 steps with and without checkpointing; for DMD2 + GAN every trained network (the
    discriminator head is called on generated and on real features before one backward)."""
    plain = Trainer(_config(recipe, False, "plain")).run()
    checkpointed = Trainer(_config(recipe, True, "checkpointed")).run()
    for name in plain.trainable_modules:
        plain_state = plain.trainable_modules[name].state_dict()
        checkpointed_state = checkpointed.trainable_modules[name].state_dict()
        assert list(plain_state) == list(checkpointed_state)  # the same keys: checkpoints do not change
        for key, value in plain_state.items():
            assert torch.equal(checkpointed_state[key], value), (name, key)  # recomputation: the same arithmetic
    units = checkpointed.net.shard_units()
    assert units and all(getattr(unit, "_fastgen_checkpointed", False) for unit in units)


def test_only_trained_networks_are_checkpointed() -> None:
    from fastgen.configs.config_utils import load_config
    from fastgen.configs.instantiate import instantiate
    from fastgen.distributed.parallelize import apply_activation_checkpointing

    config = load_config("Digits/config_dmd2_digits")
    config.model.activation_checkpointing = True
    config.model.gan_loss_weight_gen = 1e-2
    with torch.device("meta"):
        model = instantiate(config.model_class, config=config.model)
    count = apply_activation_checkpointing(model)
    trained = [u for name in ("net", "fake_score") for u in model.trainable_modules[name].shard_units()]
    assert count == len(trained) > 0
    assert not any(getattr(u, "_fastgen_checkpointed", False) for u in model.teacher.shard_units())
    assert not any(getattr(u, "_fastgen_checkpointed", False) for u in model.discriminator.shard_units())
    assert apply_activation_checkpointing(model) == 0  # idempotent


def test_the_traced_training_peak_drops_below_six_tenths() -> None:
    """DiT on digits at batch 256: the dry run's traced peak with checkpointing ÷ without (measured 0.38)."""
    from fastgen.configs.config_utils import load_config
    from fastgen.profiling.step_trace import first_batch, trace_step_peak

    peaks = []
    for checkpointed in (False, True):
        config = load_config("Digits/config_sft_dit_digits")
        config.model.activation_checkpointing = checkpointed
        config.dataloader_train.batch_size = 256
        peaks.append(trace_step_peak(config, 1, first_batch(config)).peak)
    assert peaks[1] / peaks[0] <= 0.6, peaks

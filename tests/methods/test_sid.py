"""SiD on tiny networks: the generator loss is the paper's expression and its gradient reaches the student through
the frozen denoisers' inputs (unlike DMD's). What SiD shares with DMD2 (which modules each iteration trains, a zero
loss when the fake score equals the teacher) is tested for both in ``test_dmd2.py``."""

from __future__ import annotations

import torch

from fastgen.configs.config_utils import load_config, validate_config
from fastgen.configs.instantiate import instantiate
from fastgen.methods.sid import SiDModel
from test_dmd2 import SID, build, denoised_pair, student_step_on, toy_dmd2


def test_sid_loss_is_the_papers_expression() -> None:
    """SiD Sec. 4: (1 - alpha) ||f_real - f_fake||^2 + (f_real - f_fake)^T (f_fake - x), weighted per sample by
    1 / mean|x - f_real| and averaged over elements - computed here in that form, the method in its rearranged one."""
    model = build(toy_dmd2(method=SID, sid_alpha=1.2))
    x = torch.randn(8, 2)
    loss_dict, out, _ = student_step_on(model, x)
    f_real, f_fake, w = denoised_pair(model, out, x)
    delta = f_real - f_fake
    expected = (w * ((1 - 1.2) * delta.square() + delta * (f_fake - x.detach()))).mean()
    torch.testing.assert_close(loss_dict["sid_loss"], expected, rtol=1e-5, atol=1e-7)
    assert "vsd_loss" not in loss_dict


def test_sid_gradient_flows_through_the_denoisers_inputs() -> None:
    """Holding both denoisers fixed, d L / d x is DMD's gradient (f_fake - f_real) w / numel; SiD's gradient
    differs from it by the part through x_t, which is what makes it SiD."""
    model = build(toy_dmd2(method=SID, sid_alpha=1.2))
    x = torch.randn(8, 2)
    _, out, grad_x = student_step_on(model, x)
    f_real, f_fake, w = denoised_pair(model, out, x)
    dmd_part = (f_fake - f_real) * w / x.numel()
    # The rest, through x_t: the same loss with x entering only through x_t (the step's noise re-used).
    x_in = x.detach().clone().requires_grad_(True)
    x_t = x_in + (out["x_t"] - x.detach())
    teacher = model.teacher(x_t, out["t"], fwd_pred_type="x0")
    delta = teacher - model.fake_score(x_t, out["t"], fwd_pred_type="x0")
    (grad_inputs,) = torch.autograd.grad((w * delta * ((teacher - x.detach()) - 1.2 * delta)).mean(), x_in)
    torch.testing.assert_close(grad_x, dmd_part + grad_inputs, rtol=1e-4, atol=1e-7)
    assert (grad_inputs.abs() > 1e-6).any()


def test_digits_recipe_builds_a_sid_model_on_the_quickstart_settings() -> None:
    config = validate_config(load_config("Digits/config_sid_digits"))
    quickstart = load_config("Digits/config_dmd2_digits")
    assert config.model.sid_alpha == 1.0  # tuned on digits (the paper: 1.2)
    assert config.model.student_update_freq == quickstart.model.student_update_freq
    assert config.model.gan_loss_weight_gen == quickstart.model.gan_loss_weight_gen
    assert isinstance(instantiate(config.model_class, config=config.model), SiDModel)

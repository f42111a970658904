"""SiD on tiny networks: the generator loss is the paper's expression, its gradient reaches the student through the
frozen denoisers' inputs (unlike DMD's), the fake score and teacher get none, and the critic step is DMD2's."""

from __future__ import annotations

import torch

from fastgen.configs.methods.config_sid import create_config as sid_config
from test_dmd2 import build, denoised_pair, grads, perturb, student_step_on, toy_dmd2


def toy_sid(gan: bool = False, **model: object):  # noqa: ANN201 - a BaseConfig
    config = toy_dmd2(gan=gan, **model)
    config.model_class = sid_config().model_class
    return config


def test_sid_loss_is_the_papers_expression() -> None:
    """SiD Sec. 4: (1 - alpha) ||f_real - f_fake||^2 + (f_real - f_fake)^T (f_fake - x), weighted per sample by
    1 / mean|x - f_real| and averaged over elements - computed here in that form, the method in its rearranged one."""
    model = build(toy_sid(sid_alpha=1.2))
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
    model = build(toy_sid(sid_alpha=1.2))
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


def test_sid_student_iteration_trains_only_the_student() -> None:
    model = build(toy_sid(gan=True))
    perturb(model.fake_score)
    loss_dict, _ = model.single_train_step({"real": torch.randn(16, 2)}, iteration=0)
    loss_dict["total_loss"].backward()
    assert grads(model.net)
    assert not grads(model.teacher) and not grads(model.fake_score) and not grads(model.discriminator)
    assert all(p.requires_grad for p in model.fake_score.parameters())  # `frozen` restored the flags
    assert "gan_gen_loss" in loss_dict and model.get_optimizers(0) == ["net"]


def test_sid_critic_iteration_is_dmd2s() -> None:
    model = build(toy_sid(gan=True))
    loss_dict, _ = model.single_train_step({"real": torch.randn(16, 2)}, iteration=1)
    loss_dict["total_loss"].backward()
    assert grads(model.fake_score) and grads(model.discriminator) and not grads(model.net)
    assert model.get_optimizers(1) == ["fake_score", "discriminator"]

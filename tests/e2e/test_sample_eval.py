"""``fastgen sample`` and ``fastgen eval`` end to end, on tiny checkpoints written by the real Trainer: the .npz
format of the guided-diffusion suite, reproducible seeds, the ways to name a checkpoint, JSON metrics, and
one-line exit-2 errors."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from fastgen_testing import run_cli, tiny_toy_config
from PIL import Image


def _tiny_digits_config(name: str):  # noqa: ANN202 - a BaseConfig
    from omegaconf import DictConfig

    from fastgen.configs.callbacks import EMA_CALLBACK
    from fastgen.configs.data import digits_loader
    from fastgen.configs.methods.config_sft import create_config
    from fastgen.configs.net import edm_unet_8x8

    config = create_config()
    config.model.net = edm_unet_8x8(num_classes=10, model_channels=8, channel_mult=[1, 2])
    config.model.input_shape = [1, 8, 8]
    config.model.num_classes = 10
    config.model.use_ema = True
    config.model.sample_steps = 3
    config.dataloader_train = digits_loader(split="train", batch_size=16)
    config.trainer.max_iter = 4
    config.trainer.save_ckpt_iter = 2
    config.trainer.logging_iter = 2
    config.trainer.validation_iter = None
    config.trainer.callbacks = DictConfig({**EMA_CALLBACK})
    config.log_config.group = "digits"
    config.log_config.name = name
    config.log_config.wandb_mode = "disabled"
    return config


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two runs trained through the real Trainer: class-conditional digits (checkpoints at 2 and 4) and toy."""
    from fastgen.trainer import Trainer

    root = tmp_path_factory.mktemp("runs")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FASTGEN_OUTPUT_ROOT", str(root))
        mp.setenv("WANDB_MODE", "disabled")
        digits = _tiny_digits_config("tiny_digits")
        Trainer(digits).run()
        toy = tiny_toy_config("tiny_toy_eval", max_iter=3)
        Trainer(toy).run()
        return {"digits": Path(digits.log_config.save_path), "toy": Path(toy.log_config.save_path)}


def fastgen(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess:
    """Run the command in this process (``fastgen.cli.main.main``, what the console script calls): the same
    code path, exit codes and output as ``run_cli`` without paying torch's import for every call."""
    from fastgen.cli.main import main

    capsys.readouterr()
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(["fastgen", *args], code, captured.out, captured.err)


def _one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


# ---------------------------------------------------------------------------------------------- sample + eval
def test_sample_digits_writes_guided_diffusion_npz_and_grid_then_eval_scores_it(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "digits_samples.npz"
    result = run_cli("sample", str(runs["digits"]), "-n", "30", "--seed", "3", "--batch-size", "16", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "0000004.pth" in result.stdout  # a run directory means its newest checkpoint
    with np.load(out, allow_pickle=False) as data:
        images, labels = data["arr_0"], data["arr_1"]
        assert str(data["fastgen_dataset"]) == "digits"
    assert images.dtype == np.uint8 and images.shape == (30, 8, 8, 1)
    assert labels.dtype == np.int64 and labels.tolist() == [i % 10 for i in range(30)]  # balanced classes
    assert len(np.unique(images.reshape(30, -1), axis=0)) > 1
    with Image.open(out.with_suffix(".png")) as grid:
        assert grid.mode == "L" and grid.width > 8 * 10  # 10 per row: one class per column

    report_path = tmp_path / "metrics.json"
    evaluated = run_cli("eval", str(out), "--json", str(report_path))
    assert evaluated.returncode == 0, evaluated.stderr
    assert "fd_digits" in evaluated.stdout and "accuracy" in evaluated.stdout
    report = json.loads(report_path.read_text())
    metrics = report["metrics"]
    assert metrics["dataset"] == "digits" and metrics["num_samples"] == 30
    assert report["samples"] == [str(out)]
    # What the scores mean is tested below (known-good against known-bad sample sets); a 4-iteration model
    # draws noise: far from the digits, classified near chance.
    assert metrics["fd_digits"] > 200 and metrics["accuracy"] < 0.5


def test_sample_toy_writes_points_and_scatter_then_eval_scores_them(runs: dict[str, Path], tmp_path: Path) -> None:
    checkpoint = runs["toy"] / "checkpoints" / "0000003.pth"
    result = run_cli("sample", str(checkpoint), "--ema", "-n", "64", "--out", str(tmp_path / "points"))
    assert result.returncode == 0, result.stderr
    out = tmp_path / "points.npz"
    with np.load(out, allow_pickle=False) as data:
        assert data["arr_0"].dtype == np.float32 and data["arr_0"].shape == (64, 2)
        assert "arr_1" not in data.files  # unconditional
        assert str(data["fastgen_dataset"]) == "toy:eight_gaussians"
    assert (tmp_path / "points.png").is_file()
    report_path = tmp_path / "toy.json"
    evaluated = run_cli("eval", str(tmp_path), "--json", str(report_path))  # a folder of .npz files
    assert evaluated.returncode == 0, evaluated.stderr
    metrics = json.loads(report_path.read_text())["metrics"]
    assert metrics["dataset"] == "toy:eight_gaussians" and metrics["num_samples"] == 64
    assert metrics["energy_distance"] > 0 and metrics["sliced_wasserstein"] > 0


def _digit_sets() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Sample sets of 200 digits (20 per class, drawn at random) with known quality, as ``(images in [-1, 1], labels)``: real
    digits, the same blurred (3x3 box filter), uniform noise, and the real digits with wrong labels."""
    from fastgen.datasets.digits import DigitsDataset

    data = DigitsDataset("all")
    g = torch.Generator().manual_seed(0)
    per_class = [torch.nonzero(data.labels == c).flatten() for c in range(10)]
    picks = torch.cat([idx[torch.randperm(len(idx), generator=g)[:20]] for idx in per_class])
    real, labels = data.images[picks], data.labels[picks]
    blurred = torch.nn.functional.avg_pool2d(torch.nn.functional.pad(real, (1, 1, 1, 1), mode="replicate"), 3, stride=1)
    noise = torch.rand(real.shape, generator=torch.Generator().manual_seed(0)) * 2 - 1
    return {"real": (real, labels), "blurred": (blurred, labels), "noise": (noise, labels),
            "wrong_labels": (real, (labels + 1) % 10)}


def test_eval_scores_real_digits_better_than_blurred_ones_and_blurred_better_than_noise(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``fastgen eval`` on sets of 200 written as ``fastgen sample`` writes them. Measured FD_digits (accuracy):
    real 4.22 (1.0; other random draws of 20 per class: 3.1 - 4.3), blurred 382 (0.725), noise 733 (0.08),
    wrong labels 4.22 (0.0). FD grows with the damage, accuracy falls to chance, and wrong labels leave FD as it
    is but take accuracy to 0."""
    from fastgen.evaluation.sampling import save_samples

    scores = {}
    for name, (images, labels) in _digit_sets().items():
        npz, _ = save_samples(tmp_path / f"{name}.npz", images, labels, dataset="digits")
        report = tmp_path / f"{name}.json"
        result = fastgen(capsys, "eval", str(npz), "--json", str(report))
        assert result.returncode == 0, result.stderr
        scores[name] = json.loads(report.read_text())["metrics"]
    fd = {name: m["fd_digits"] for name, m in scores.items()}
    accuracy = {name: m["accuracy"] for name, m in scores.items()}
    assert fd["real"] < 10 and accuracy["real"] >= 0.95
    assert fd["blurred"] > 10 * fd["real"] and accuracy["blurred"] < accuracy["real"] - 0.1
    assert fd["noise"] > 1.5 * fd["blurred"] and accuracy["noise"] < 0.3
    assert fd["wrong_labels"] == pytest.approx(fd["real"]) and accuracy["wrong_labels"] < 0.05


def test_eval_scores_toy_data_better_than_a_gaussian_blob(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Energy distance and sliced Wasserstein distance of 1,000 points: fresh eight-Gaussians data (another seed
    than the reference draw) against a normal blob of the same spread. Measured: energy distance 0.0021 against
    0.062, sliced Wasserstein 0.036 against 0.25."""
    from fastgen.datasets.toy import toy_samples
    from fastgen.evaluation.sampling import save_samples

    good = toy_samples("eight_gaussians", 1000, seed=7)
    bad = torch.randn(1000, 2, generator=torch.Generator().manual_seed(7)) * good.std(dim=0)
    metrics = {}
    for name, points in (("good", good), ("bad", bad)):
        npz, _ = save_samples(tmp_path / f"{name}.npz", points, None, dataset="toy:eight_gaussians")
        result = fastgen(capsys, "eval", str(npz), "--json", str(tmp_path / f"{name}.json"))
        assert result.returncode == 0, result.stderr
        metrics[name] = json.loads((tmp_path / f"{name}.json").read_text())["metrics"]
    for key in ("energy_distance", "sliced_wasserstein"):
        assert metrics["good"][key] < 0.25 * metrics["bad"][key], (key, metrics)


def test_samples_of_the_shipped_teacher_score_far_better_than_those_of_a_barely_trained_run(
        runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``fastgen sample`` then ``fastgen eval``, 100 samples each: the shipped digits teacher (18 Heun steps;
    measured FD_digits 10.4 / 10.2 / 9.0 at sampling seeds 1 / 2 / 3, accuracy 0.99 / 0.97 / 0.97 - FD at 100
    samples is biased upwards; 0.56 at 5,000) against the 4-iteration run (637, accuracy 0.09)."""
    from importlib import resources

    teacher = resources.files("fastgen") / "assets" / "digits_teacher.pth"
    metrics = {}
    for name, args in (("teacher", [str(teacher), "--config", "Digits/config_sft_digits"]),
                       ("untrained", [str(runs["digits"]), "--ema"])):
        out = tmp_path / f"{name}.npz"
        sampled = fastgen(capsys, "sample", *args, "-n", "100", "--seed", "1", "--out", str(out))
        assert sampled.returncode == 0, sampled.stderr
        evaluated = fastgen(capsys, "eval", str(out), "--json", str(tmp_path / f"{name}.json"))
        assert evaluated.returncode == 0, evaluated.stderr
        metrics[name] = json.loads((tmp_path / f"{name}.json").read_text())["metrics"]
    assert metrics["teacher"]["fd_digits"] < 20 and metrics["teacher"]["accuracy"] >= 0.9
    assert metrics["teacher"]["fd_digits"] < 0.1 * metrics["untrained"]["fd_digits"]
    assert metrics["untrained"]["accuracy"] < 0.5


def test_checkpoint_forms_label_and_default_output_path(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    checkpoints = runs["digits"] / "checkpoints"
    result = fastgen(capsys, "sample", str(checkpoints), "-n", "12", "--label", "7", "--ema")
    assert result.returncode == 0, result.stderr
    default = runs["digits"] / "samples" / "sample_0000004_ema_n12_seed0.npz"
    assert str(default) in result.stdout
    with np.load(default, allow_pickle=False) as data:
        assert data["arr_1"].tolist() == [7] * 12
    older = fastgen(capsys, "sample", str(checkpoints / "0000002.pth"), "-n", "4", "--steps", "2")
    assert older.returncode == 0, older.stderr
    assert (runs["digits"] / "samples" / "sample_0000002_net_steps2_n4_seed0.npz").is_file()


# ------------------------------------------------------------------------------------------ reproducibility
def test_same_seed_same_samples_whatever_the_batch_size(runs: dict[str, Path]) -> None:
    from fastgen.evaluation.sampling import draw_samples, load_run, select_net

    run = load_run(runs["digits"])
    net = select_net(run, "ema")
    a, labels_a = draw_samples(run.model, 10, seed=5, batch_size=10, net=net)
    b, labels_b = draw_samples(run.model, 10, seed=5, batch_size=3, net=net)
    c, _ = draw_samples(run.model, 10, seed=6, batch_size=10, net=net)
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert torch.equal(labels_a, labels_b)
    assert not torch.allclose(a, c)
    again, _ = draw_samples(run.model, 10, seed=5, batch_size=3, net=net)
    assert torch.equal(b, again)
    # the caller's random stream is left as it was
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    draw_samples(run.model, 4, seed=1, net=net)
    assert torch.equal(torch.rand(3), expected)


def test_evaluate_model_equals_eval_of_the_saved_file(runs: dict[str, Path], tmp_path: Path) -> None:
    from fastgen.evaluation import evaluate_model
    from fastgen.evaluation.evaluate import evaluate_arrays, load_sample_files
    from fastgen.evaluation.sampling import draw_samples, load_run, save_samples

    run = load_run(runs["digits"])
    in_memory = evaluate_model(run.model, 20, seed=2, batch_size=8)
    samples, labels = draw_samples(run.model, 20, seed=2, batch_size=8)
    npz, _ = save_samples(tmp_path / "s.npz", samples, labels, dataset="digits")
    loaded = load_sample_files(npz)
    from_file = evaluate_arrays(loaded.arr_0, loaded.arr_1, "digits")
    # Same uint8 images; BLAS results may differ in the last bits with the arrays' memory alignment.
    assert in_memory.pop("fd_digits") == pytest.approx(from_file.pop("fd_digits"), rel=1e-6)
    assert in_memory == from_file
    assert set(in_memory) == {"dataset", "accuracy", "num_samples"}


def test_teacher_sampling_uses_model_teacher_with_the_given_steps(runs: dict[str, Path]) -> None:
    """Distillation methods expose ``model.teacher``; sampling it goes through ``generator_fn(teacher, ...)``."""
    import copy

    from fastgen.evaluation.sampling import draw_samples, load_run, select_net
    from fastgen.utils.errors import UsageError

    run = load_run(runs["digits"])
    with pytest.raises(UsageError, match="no teacher"):
        select_net(run, "teacher")
    teacher = copy.deepcopy(run.model.net)
    with torch.no_grad():
        for p in teacher.parameters():
            p.mul_(0.5)
    run.model.teacher = teacher
    assert select_net(run, "teacher") is teacher
    from_teacher, _ = draw_samples(run.model, 4, seed=0, net=teacher, steps=2)
    from_net, _ = draw_samples(run.model, 4, seed=0, net=run.model.net, steps=2)
    assert from_teacher.shape == (4, 1, 8, 8) and not torch.allclose(from_teacher, from_net)


# ------------------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        (["--teacher"], ["--teacher", "no teacher"]),
        (["--label", "12"], ["--label 12", "between 0 and 9"]),
        (["--ema", "--teacher"], ["exclude each other"]),
        (["--device", "cuda:7"], ["--device cuda:7"]),
    ],
)
def test_sample_usage_errors_are_one_line_exit_2(runs: dict[str, Path], extra: list[str], fragments: list[str],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    _one_line_error(fastgen(capsys, "sample", str(runs["digits"]), "-n", "2", *extra), *fragments)


def test_sample_missing_checkpoint_and_ema_without_ema(runs: dict[str, Path], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    # A missing checkpoint, through the installed command: one line, exit 2, no traceback.
    missing = run_cli("sample", str(tmp_path / "missing.pth"))
    _one_line_error(missing, "checkpoint not found", "missing.pth")
    assert "Traceback" not in missing.stderr
    empty = tmp_path / "empty_dir"
    empty.mkdir()
    _one_line_error(fastgen(capsys, "sample", str(empty)), "no valid checkpoint")
    # A config without EMA: the run's checkpoint no longer fits (strict loading; a checkpoint error, exit 1) ...
    config = runs["toy"] / "config.yaml"
    no_ema_config = tmp_path / "no_ema" / "config.yaml"
    no_ema_config.parent.mkdir()
    no_ema_config.write_text(config.read_text().replace("use_ema: true", "use_ema: false"))
    assert no_ema_config.read_text() != config.read_text()
    checkpoint = runs["toy"] / "checkpoints" / "0000003.pth"
    mismatch = fastgen(capsys, "sample", str(checkpoint), "--config", str(no_ema_config))
    assert mismatch.returncode == 1 and "has weights for 'ema'" in mismatch.stderr
    # ... while a bare state dict of `net` (as exported by other tools) loads, and --ema is a usage error.
    from fastgen.checkpoint.checkpointer import load_checkpoint

    bare = tmp_path / "net_only.pth"
    torch.save(load_checkpoint(checkpoint)["model"]["net"], bare)
    ok = fastgen(capsys, "sample", str(bare), "--config", str(no_ema_config), "-n", "3", "--out", str(tmp_path / "b"))
    assert ok.returncode == 0, ok.stderr
    _one_line_error(fastgen(capsys, "sample", str(bare), "--config", str(no_ema_config), "--ema"), "no EMA network")
    _one_line_error(fastgen(capsys, "sample", str(bare)), "no config.yaml", "--config")


def test_eval_errors_are_one_line_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    _one_line_error(fastgen(capsys, "eval", str(tmp_path / "none.npz")), "samples not found")
    odd = tmp_path / "odd.npz"
    np.savez(odd, arr_0=np.zeros((4, 3, 3), dtype=np.float32))
    _one_line_error(fastgen(capsys, "eval", str(odd)), "cannot tell the data set")
    points = tmp_path / "points.npz"
    np.savez(points, arr_0=np.zeros((4, 2), dtype=np.float32))
    _one_line_error(fastgen(capsys, "eval", str(points)), "--dataset toy:<name>")
    _one_line_error(fastgen(capsys, "eval", str(points), "--dataset", "toy:spiral"), "unknown toy distribution")
    cifar = tmp_path / "cifar.npz"
    np.savez(cifar, arr_0=np.zeros((4, 32, 32, 3), dtype=np.uint8))
    monkeypatch.delenv("FASTGEN_INCEPTION_WEIGHTS", raising=False)
    _one_line_error(fastgen(capsys, "eval", str(cifar)), "--inception-weights")
    _one_line_error(fastgen(capsys, "eval", str(cifar), "--inception-weights", str(tmp_path / "no.pth")), "not found")
    not_npz = tmp_path / "bad.npz"
    not_npz.write_bytes(b"not a zip file")
    _one_line_error(fastgen(capsys, "eval", str(not_npz)), "bad.npz is not an .npz file")
    _one_line_error(fastgen(capsys, "eval", str(cifar), "--dataset", "digits"), "--dataset digits")
    _one_line_error(fastgen(capsys, "eval", str(cifar), "--dataset", "mnist"), "unknown dataset")


@pytest.mark.parametrize("command", ["sample", "eval"])
def test_help_has_examples(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    result = fastgen(capsys, command, "--help")
    assert result.returncode == 0
    assert "Examples:" in result.stdout and f"fastgen {command} " in result.stdout
    listing = fastgen(capsys, "--help")
    assert command in listing.stdout

"""The ``fastgen`` command as a user runs it: exit codes, one-line errors, nothing half-written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fastgen_testing import FASTGEN, run_cli

REPO = Path(__file__).resolve().parents[2]
TINY = "trainer.max_iter=3 trainer.save_ckpt_iter=3 trainer.logging_iter=1 trainer.validation_iter=null dataloader_train.batch_size=8 model.net.backbone.hidden_dim=16".split()


def _one_line_error(result: subprocess.CompletedProcess, code: int, *fragments: str) -> None:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error:"), lines
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def _files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def test_help_lists_commands_and_version() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    for command in ("train", "dryrun", "init", "env"):
        assert command in result.stdout
    version = run_cli("--version")
    assert version.returncode == 0 and version.stdout.startswith("fastgen ")


@pytest.mark.parametrize("command", ["train", "dryrun", "init", "env"])
def test_every_command_help_has_examples(command: str) -> None:
    result = run_cli(command, "--help")
    assert result.returncode == 0
    assert "Examples" in result.stdout and "fastgen " + command in result.stdout


def test_help_does_not_import_torch_or_wandb() -> None:
    code = (
        "import sys\n"
        "from fastgen.cli.main import app\n"
        "try:\n    app(['--help'], prog_name='fastgen')\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('torch', 'wandb', 'numpy', 'omegaconf', 'hydra') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "HEAVY []" in result.stdout, result.stdout + result.stderr


def test_train_tiny_toy_run(output_root: Path, tmp_path: Path) -> None:
    result = run_cli("train", "--config=Toy/config_sft_toy", "-", *TINY, "log_config.name=cli_toy", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    run_dir = output_root / "fastgen" / "toy" / "cli_toy"
    assert (run_dir / "config.yaml").is_file()
    assert (run_dir / "checkpoints" / "0000003.pth").is_file()
    assert (run_dir / "samples" / "iter_0000003.png").is_file()
    assert "iteration 3/3" in result.stderr  # plain log lines when not on a terminal


def test_seed_grammar_with_log_level_and_dryrun_writes_nothing(output_root: Path) -> None:
    result = subprocess.run(
        [sys.executable, "train.py", "--config=fastgen/configs/experiments/Toy/config_sft_toy.py",
         "--log_level", "DEBUG", "--dryrun", "-", "trainer.max_iter=10000", "model.net_optimizer.lr=2e-4",
         "log_config.name=my_experiment"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "max_iter: 10000" in result.stdout and "my_experiment" in result.stdout
    assert _files_under(output_root) == []


def test_dryrun_prints_tree_counts_and_yaml_that_loads_back(output_root: Path, tmp_path: Path) -> None:
    tree = run_cli("dryrun", "-c", "Digits/config_sft_digits")
    assert tree.returncode == 0, tree.stderr
    assert "build plan" in tree.stdout and "ema" in tree.stdout
    assert "1,026,273" in tree.stdout  # the digits U-Net's parameter count, built on the meta device
    as_yaml = run_cli("dryrun", "-c", "Digits/config_sft_digits", "--yaml", "-", "trainer.max_iter=7")
    assert as_yaml.returncode == 0, as_yaml.stderr
    saved = tmp_path / "resolved.yaml"
    saved.write_text(as_yaml.stdout)
    from fastgen.configs.config_utils import apply_overrides, load_config

    expected = apply_overrides(load_config("Digits/config_sft_digits"), ["trainer.max_iter=7"])
    assert load_config(saved) == expected
    assert _files_under(output_root) == []


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--config=does/not/exist.py"], ["config file not found", "does/not/exist.py"]),
        (["--config=no_such_recipe"], ["no config file or built-in recipe"]),
        (["--config=Toy/config_sft_toy", "trainer.max_itr=5"], ["unknown key 'trainer.max_itr'", "max_iter"]),
        (["--config=Toy/config_sft_toy", "trainer.max_iter=abc"], ["trainer.max_iter", "expected int"]),
        (["--config=Toy/config_sft_toy", "trainer.resume=maybe"], ["trainer.resume", "expected bool"]),
        (["--config=Toy/config_sft_toy", "trainer.max_iter=[1"], ["cannot parse override"]),
        (["--config=Toy/config_sft_toy", "--log_level", "LOUD"], ["unknown log level"]),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(args: list[str], fragments: list[str], output_root: Path, tmp_path: Path) -> None:
    result = run_cli("train", *args, cwd=tmp_path)
    _one_line_error(result, 2, *fragments)
    assert _files_under(output_root) == []


def test_config_file_without_create_config(output_root: Path, tmp_path: Path) -> None:
    (tmp_path / "empty_cfg.py").write_text("x = 1\n")
    _one_line_error(run_cli("train", "--config=empty_cfg.py", cwd=tmp_path), 2, "does not define create_config()")
    (tmp_path / "broken_cfg.py").write_text("def create_config(:\n")
    _one_line_error(run_cli("train", "--config=broken_cfg.py", cwd=tmp_path), 2, "syntax error")
    assert _files_under(output_root) == []


def test_usage_errors_from_click_exit_2(tmp_path: Path) -> None:
    result = run_cli("train", "--no-such-option", cwd=tmp_path)
    assert result.returncode == 2
    assert run_cli("no-such-command").returncode == 2


def test_unwritable_output_directory(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run_cli("train", "-c", "Toy/config_sft_toy", *TINY, env={"FASTGEN_OUTPUT_ROOT": str(blocker / "out")})
    _one_line_error(result, 2, "cannot write to output directory")


def test_corrupt_checkpoint_is_exit_1_one_line(output_root: Path, tmp_path: Path) -> None:
    ok = run_cli("train", "-c", "Toy/config_sft_toy", *TINY, "log_config.name=corrupt", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    ckpt = output_root / "fastgen" / "toy" / "corrupt" / "checkpoints" / "0000003.pth"
    ckpt.write_bytes(ckpt.read_bytes()[:1000])
    before = _files_under(output_root)
    result = run_cli("train", "-c", "Toy/config_sft_toy", *TINY, "trainer.max_iter=6", "log_config.name=corrupt", cwd=tmp_path)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "corrupt or truncated" in errors[0] and "0000003.pth" in errors[0]
    assert "Traceback" not in result.stderr
    assert _files_under(output_root) == before


def test_debug_env_shows_the_traceback(tmp_path: Path) -> None:
    """``FASTGEN_DEBUG=1`` turns the one-line error into the traceback of *that* error: a traceback of anything
    else (a crash on the way) or the one line alone fails."""
    result = run_cli("train", "--config=missing.py", cwd=tmp_path, env={"FASTGEN_DEBUG": "1"})
    assert result.returncode == 2  # the same exit code as without FASTGEN_DEBUG
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback (most recent call last):" in lines, result.stderr
    assert lines[-2] == "fastgen.utils.errors.ConfigError: config file not found: missing.py", result.stderr
    assert lines[-1] == "error: config file not found: missing.py", result.stderr
    _one_line_error(run_cli("train", "--config=missing.py", cwd=tmp_path), 2, "config file not found: missing.py")


def test_init_scaffolds_a_config_that_trains(output_root: Path, tmp_path: Path) -> None:
    result = run_cli("init", "my_toy", "--from", "Toy/config_sft_toy", "--callback", "--env", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for name in ("my_toy.py", "my_toy_callback.py", ".env"):
        assert (tmp_path / name).is_file(), name
    again = run_cli("init", "my_toy", "--from", "Toy/config_sft_toy", cwd=tmp_path)
    _one_line_error(again, 2, "exists already", "--force")
    assert run_cli("init", "my_toy", "--from", "Toy/config_sft_toy", "--force", cwd=tmp_path).returncode == 0
    bad = run_cli("init", "other", "--from", "Toy/config_sft_tyo", cwd=tmp_path)
    _one_line_error(bad, 2, "no built-in recipe", "Toy/config_sft_toy")
    assert not (tmp_path / "other.py").exists()

    # The scaffold with its callback trains as generated.
    run = run_cli("init", "with_cb", "--from", "Toy/config_sft_toy", "--callback", cwd=tmp_path)
    assert run.returncode == 0
    trained = run_cli("train", "--config=with_cb.py", "-", *TINY, cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr
    assert (output_root / "fastgen" / "toy" / "with_cb" / "checkpoints" / "0000003.pth").is_file()


def test_env_reports_credentials_without_values(tmp_path: Path) -> None:
    creds = tmp_path / "credentials"
    creds.mkdir()
    (creds / "wandb_api.txt").write_text("s3cr3t-wandb-key\n")
    (creds / "s3.json").write_text('{"aws_access_key_id": "AKIAEXAMPLE", "aws_secret_access_key": "very-secret"}')
    result = run_cli("env", "--credentials-dir", str(creds), cwd=tmp_path, env={"OPENAI_API_KEY": "sk-from-env"})
    assert result.returncode == 0, result.stderr
    assert "WANDB_API_KEY" in result.stdout and "wandb_api.txt" in result.stdout
    for secret in ("s3cr3t-wandb-key", "AKIAEXAMPLE", "very-secret", "sk-from-env"):
        assert secret not in result.stdout + result.stderr


def test_env_json_has_the_documented_keys_and_no_secret_values(tmp_path: Path, output_root: Path) -> None:
    """``fastgen env --json``: the four sections with their keys and the values of this installation; every
    credential that is set (from the credentials folder, the environment or ``.env``) says where it came from,
    and none of their values appears anywhere in the output."""
    import json

    import torch

    import fastgen

    creds = tmp_path / "credentials"
    creds.mkdir()
    (creds / "wandb_api.txt").write_text("wandb-8f1e2d3c4b5a\n")
    (creds / "s3.json").write_text('{"aws_access_key_id": "AKIA7Q2W3E4R", "aws_secret_access_key": "aws-9z8y7x6w"}')
    (tmp_path / ".env").write_text("AWS_SESSION_TOKEN=session-5t4r3e2w\n")
    secrets = {"WANDB_API_KEY": "wandb-8f1e2d3c4b5a", "AWS_ACCESS_KEY_ID": "AKIA7Q2W3E4R",
               "AWS_SECRET_ACCESS_KEY": "aws-9z8y7x6w", "AWS_SESSION_TOKEN": "session-5t4r3e2w",
               "OPENAI_API_KEY": "sk-openai-1a2b3c4d"}
    result = run_cli("env", "--json", "--credentials-dir", str(creds), cwd=tmp_path,
                     env={"OPENAI_API_KEY": secrets["OPENAI_API_KEY"]})
    assert result.returncode == 0, result.stderr
    for value in secrets.values():
        assert value not in result.stdout and value not in result.stderr
    report = json.loads(result.stdout)
    assert set(report) == {"versions", "devices", "paths", "credentials"}
    assert set(report["versions"]) == {"fastgen", "python", "torch", "wandb", "omegaconf", "hydra-core", "platform"}
    assert report["versions"]["fastgen"] == fastgen.__version__
    assert report["versions"]["torch"] == torch.__version__
    assert report["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert report["devices"]["cuda"] in ("available", "not available")
    paths = report["paths"]
    assert {"working directory", ".env", "FASTGEN_OUTPUT_ROOT", "DATA_ROOT_DIR", "credentials_dir"} <= set(paths)
    assert "FASTGEN_DATA_ROOT" not in paths  # one name for the data root, the one .env.example documents
    assert Path(paths["working directory"]) == tmp_path.resolve()
    assert paths[".env"] == f"{(tmp_path / '.env').resolve()} (loaded)"
    assert Path(paths["FASTGEN_OUTPUT_ROOT"]) == output_root.resolve()
    assert Path(paths["credentials_dir"]) == creds.resolve()
    credentials = report["credentials"]
    assert set(secrets) <= set(credentials)
    assert credentials["WANDB_API_KEY"] == f"set (from {creds / 'wandb_api.txt'})"
    assert credentials["AWS_SECRET_ACCESS_KEY"] == f"set (from {creds / 's3.json'})"
    assert credentials["AWS_SESSION_TOKEN"].startswith("set (") and credentials["OPENAI_API_KEY"].startswith("set (")
    assert credentials["AWS_REGION"] == "not set"


def test_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    import pty

    master, slave = pty.openpty()
    env = dict(os.environ)
    env.pop("FASTGEN_NO_PROGRESS", None)
    env["COLUMNS"] = "140"
    proc = subprocess.Popen([FASTGEN, "train", "-c", "Toy/config_sft_toy", *TINY, "trainer.max_iter=40"],
                            cwd=tmp_path, stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=120)
    os.close(master)
    screen = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 0, screen
    assert "it/s" in screen and "ETA" in screen and "40/40" in screen and "loss" in screen


def test_a_runs_config_yaml_resumes_that_run(output_root: Path, tmp_path: Path) -> None:
    first = run_cli("train", "-c", "Toy/config_sft_toy", *TINY, "log_config.name=from_yaml", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    run_dir = output_root / "fastgen" / "toy" / "from_yaml"
    again = run_cli("train", f"--config={run_dir / 'config.yaml'}", "trainer.max_iter=5", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "resumed from" in again.stderr and "iteration 5/5" in again.stderr
    assert (run_dir / "checkpoints" / "0000005.pth").is_file()


def test_shell_completion_script_and_completions() -> None:
    # Typer detects the shell from the parent process, so ask from inside bash, as a user's terminal would (the
    # second command keeps bash from exec'ing fastgen in its place).
    script = subprocess.run(["bash", "-c", f"{FASTGEN} --show-completion; exit $?"], capture_output=True, text=True,
                            timeout=60)
    assert script.returncode == 0 and "_fastgen_completion" in script.stdout, script.stderr
    completions = run_cli(env={"_FASTGEN_COMPLETE": "complete_bash", "COMP_WORDS": "fastgen dr", "COMP_CWORD": "1"})
    assert "dryrun" in completions.stdout

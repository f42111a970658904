"""Start-up as a new user meets it: every failure before the first iteration is one line, the right exit code,
and leaves the output root exactly as it was (nothing half-made; a resumed run's files untouched)."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from fastgen_testing import FASTGEN, interruptible, run_cli

TINY = ("trainer.logging_iter=1 trainer.validation_iter=null dataloader_train.batch_size=8 "
        "model.net.backbone.hidden_dim=16").split()


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (``None`` for a folder): equal snapshots = nothing changed."""
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


def one_error_line(result: subprocess.CompletedProcess, code: int, *fragments: str) -> str:
    """The run failed with ``code`` and said so in exactly one ``error:`` line, with no traceback."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    for fragment in fragments:
        assert fragment in errors[0], (fragment, errors[0])
    return errors[0]


# ---- bad config input: refused by validation, identically in train and dryrun, before anything is created ------
@pytest.mark.parametrize("command", ["train", "dryrun"])
@pytest.mark.parametrize("override, fragments", [
    ("model.net_optimizer={lr:0.1}", ["model.net_optimizer", "no _target_", "model.net_optimizer.lr="]),
    ("++model.net_optimizer.foo=1", ["model.net_optimizer.foo", "torch.optim.Adam takes no argument 'foo'"]),
    ("+trainer.callbacks.mine={_target_:not_a_module.MyCallback}", ["trainer.callbacks.mine._target_",
                                                                     "not_a_module.MyCallback"]),
    ("+trainer.callbacks.mine={_target_:torch.nn.Linear,in_features:1,out_features:1}",
     ["trainer.callbacks.mine", "not a fastgen Callback"]),
    ("model.net.backbone={hidden_dim:8}", ["model.net.backbone", "no _target_"]),
])
def test_config_errors_name_the_key_in_train_and_dryrun(command: str, override: str, fragments: list[str],
                                                         output_root: Path, tmp_path: Path) -> None:
    before = snapshot(output_root)
    result = run_cli(command, "-c", "Toy/config_sft_toy", "-", *TINY, override, cwd=tmp_path)
    one_error_line(result, 2, *fragments)
    assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1, result.stderr
    assert snapshot(output_root) == before


def test_create_config_that_raises_names_the_file_and_function(output_root: Path, tmp_path: Path) -> None:
    (tmp_path / "broken_config.py").write_text(textwrap.dedent("""\
        from fastgen.configs.experiments.Toy.config_sft_toy import create_config as base

        def create_config():
            config = base()
            return config.trainer.no_such_field
    """))
    result = run_cli("train", "-c", "broken_config.py", cwd=tmp_path)
    one_error_line(result, 2, "create_config() in broken_config.py", "AttributeError", "line 5", "no_such_field")
    assert snapshot(output_root) == {}


def test_yaml_parse_error_is_one_line_with_the_line_number(output_root: Path, tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("trainer:\n  max_iter: 3\n bad: [\n")
    result = run_cli("train", "-c", "bad.yaml", cwd=tmp_path)
    one_error_line(result, 2, "bad.yaml", "line 3")
    assert snapshot(output_root) == {}


# ---- failures while the run starts: what this start created is removed ------------------------------------------
def test_invalid_wandb_key_suggests_offline_and_leaves_nothing(output_root: Path, tmp_path: Path) -> None:
    before = snapshot(output_root)
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    env["WANDB_API_KEY"] = "not-a-key"
    result = subprocess.run([FASTGEN, "train", "-c", "Toy/config_sft_toy", "-", *TINY, "trainer.max_iter=2",
                             "log_config.wandb_mode=online"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=240)
    line = one_error_line(result, 2, "W&B", "log_config.wandb_mode=offline")
    assert "not-a-key" not in result.stderr + result.stdout
    assert "WANDB_API_KEY" in line
    assert snapshot(output_root) == before


def test_runtime_failure_in_start_up_removes_the_new_run_directory(output_root: Path, tmp_path: Path) -> None:
    (tmp_path / "failing_cb.py").write_text(textwrap.dedent("""\
        from fastgen.callbacks.callback import Callback

        class FailAtStart(Callback):
            def on_dataloader_init_end(self, model, dataloader_train=None, dataloader_val=None):
                raise RuntimeError("the data server is unreachable")
    """))
    result = run_cli("train", "-c", "Toy/config_sft_toy", "-", *TINY, "trainer.max_iter=2",
                     "+trainer.callbacks.fail={_target_:failing_cb.FailAtStart}", cwd=tmp_path,
                     env={"PYTHONPATH": str(tmp_path)})
    one_error_line(result, 1, "the data server is unreachable")
    assert snapshot(output_root) == {}


PAUSING_CONFIG = """\
import os
import time
from pathlib import Path

from fastgen.callbacks.callback import Callback
from fastgen.configs.experiments.Toy.config_sft_toy import create_config as base
from fastgen.configs.instantiate import LazyCall

PAUSE_IN = os.environ.get("PAUSE_IN", "")


def pause(where):
    if where == PAUSE_IN:
        Path("paused").write_text(where)
        time.sleep(120)


class Pause(Callback):
    def on_app_begin(self):
        pause("on_app_begin")

    def on_model_init_end(self, model):
        pause("on_model_init_end")

    def on_load_checkpoint_start(self, model):
        pause("on_load_checkpoint_start")

    def on_dataloader_init_end(self, model, dataloader_train=None, dataloader_val=None):
        pause("on_dataloader_init_end")

    def on_train_begin(self, model, iteration=0):
        pause("on_train_begin")


def create_config():
    pause("create_config")
    config = base()
    config.trainer.callbacks = {"pause": LazyCall(Pause)(), **config.trainer.callbacks}
    return config
"""


def interrupt_at(phase: str, tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    """Start ``fastgen train`` with a config that pauses at ``phase``, press Ctrl-C (SIGINT) there."""
    (tmp_path / "pausing_config.py").write_text(PAUSING_CONFIG)
    marker = tmp_path / "paused"
    marker.unlink(missing_ok=True)
    process = subprocess.Popen([FASTGEN, "train", "-c", "pausing_config.py", "-", *TINY, *overrides],
                               cwd=tmp_path, env={**os.environ, "PAUSE_IN": phase}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, f"the run never reached {phase}"
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@pytest.mark.parametrize("phase", ["create_config", "on_app_begin", "on_model_init_end", "on_load_checkpoint_start",
                                   "on_dataloader_init_end", "on_train_begin"])
def test_ctrl_c_during_start_up_says_so_and_leaves_nothing(phase: str, output_root: Path, tmp_path: Path) -> None:
    before = snapshot(output_root)
    result = interrupt_at(phase, tmp_path, "trainer.max_iter=2")
    one_error_line(result, 130, "interrupted")
    assert snapshot(output_root) == before


def test_ctrl_c_while_resuming_leaves_the_run_as_it_was(output_root: Path, tmp_path: Path) -> None:
    (tmp_path / "pausing_config.py").write_text(PAUSING_CONFIG)
    first = run_cli("train", "-c", "pausing_config.py", "-", *TINY, "trainer.max_iter=2", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    before = snapshot(output_root)
    result = interrupt_at("on_dataloader_init_end", tmp_path, "trainer.max_iter=4")
    one_error_line(result, 130, "interrupted")
    assert snapshot(output_root) == before


# ---- resume failures leave the existing run untouched -------------------------------------------------------------
def test_a_truncated_newest_checkpoint_is_skipped_with_a_warning(output_root: Path, tmp_path: Path) -> None:
    """The README's rule, the same as sample's and convert-ckpt's: a run resumes from its newest *valid*
    checkpoint; a truncated newer one is named in a warning and skipped."""
    first = run_cli("train", "-c", "Toy/config_sft_toy", "-", *TINY, "trainer.max_iter=4",
                    "trainer.save_ckpt_iter=2", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    newest = output_root / "fastgen" / "toy" / "config_sft_toy" / "checkpoints" / "0000004.pth"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    result = run_cli("train", "-c", "Toy/config_sft_toy", "-", *TINY, "trainer.max_iter=6",
                     "trainer.save_ckpt_iter=2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "skipping checkpoint" in result.stderr and "0000004.pth" in result.stderr, result.stderr
    assert "resumed from" in result.stderr and "0000002.pth (iteration 2)" in result.stderr, result.stderr


def test_corrupt_newest_checkpoint_names_the_previous_one_and_changes_nothing(output_root: Path,
                                                                               tmp_path: Path) -> None:
    """A newest checkpoint that is a whole zip but does not load (its pickle is damaged) is an error that names the
    complete one before it; nothing is changed."""
    from hostile_files import replace_data_pkl

    first = run_cli("train", "-c", "Toy/config_sft_toy", "-", *TINY, "trainer.max_iter=4",
                    "trainer.save_ckpt_iter=2", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    run_dir = output_root / "fastgen" / "toy" / "config_sft_toy"
    newest = run_dir / "checkpoints" / "0000004.pth"
    damaged = tmp_path / "damaged.pth"
    replace_data_pkl(newest, damaged, b"\x80\x02}q\x00(X")  # a pickle cut off after a few opcodes
    damaged.replace(newest)
    before = snapshot(output_root)
    result = run_cli("train", "-c", "Toy/config_sft_toy", "-", *TINY, "trainer.max_iter=6",
                     "trainer.save_ckpt_iter=2", cwd=tmp_path)
    line = one_error_line(result, 1, "0000004.pth", "corrupt or truncated", "previous checkpoint 0000002.pth",
                          "a new log_config.name")
    assert line.rstrip().endswith("(a new log_config.name)"), line  # the advice is whole, not cut off
    assert snapshot(output_root) == before  # config.yaml not rewritten with max_iter=6


# ---- the rest of the start-up experience ---------------------------------------------------------------------------
def test_debug_log_level_says_what_start_up_resolved_and_built(output_root: Path, tmp_path: Path) -> None:
    result = run_cli("train", "-c", "Toy/config_sft_toy", "--log_level", "DEBUG", "-", *TINY, "trainer.max_iter=2",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    log = result.stderr
    for fragment in ("config: create_config() of", "config_sft_toy.py", "override trainer.max_iter=2",
                     "callback grad_clip: fastgen.callbacks.grad_clip.GradClipCallback",
                     "run directory", "module net: DiffusionNet", "trainable",
                     "optimizer net: Adam (group 0:", "no valid checkpoint in"):
        assert fragment in log, (fragment, log)
    again = run_cli("train", "-c", "Toy/config_sft_toy", "--log_level", "DEBUG", "-", *TINY, "trainer.max_iter=3",
                    cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "resuming from 0000002.pth: the newest of 1 valid checkpoint(s)" in again.stderr, again.stderr
    quiet = run_cli("train", "-c", "Toy/config_sft_toy", "-", *TINY, "trainer.max_iter=3", cwd=tmp_path)
    assert "DEBUG" not in quiet.stderr and "module net:" not in quiet.stderr


def test_init_env_keeps_an_existing_env_and_scaffolds_the_rest(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("DATA_ROOT_DIR=/mine\n")
    result = run_cli("init", "my_exp", "--env", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / ".env").read_text() == "DATA_ROOT_DIR=/mine\n"
    assert (tmp_path / "my_exp.py").is_file()
    assert "kept the existing .env" in result.stderr
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert run_cli("init", "my_exp", "--env", cwd=fresh).returncode == 0
    assert "DATA_ROOT_DIR=" in (fresh / ".env").read_text()


def test_data_root_is_data_root_dir_everywhere(tmp_path: Path) -> None:
    result = run_cli("env", "--json", cwd=tmp_path, env={"DATA_ROOT_DIR": str(tmp_path / "datasets")})
    assert result.returncode == 0, result.stderr
    assert f'"DATA_ROOT_DIR": "{tmp_path / "datasets"}"' in result.stdout
    default = run_cli("env", "--json", cwd=tmp_path, env={"DATA_ROOT_DIR": ""})
    assert f'"DATA_ROOT_DIR": "{tmp_path / "data"} (default)"' in default.stdout
    dry = run_cli("dryrun", "-c", "EDM/config_sft_cifar10", "--yaml", cwd=tmp_path,
                  env={"DATA_ROOT_DIR": str(tmp_path / "datasets")})
    assert dry.returncode == 0, dry.stderr
    assert f"path: {tmp_path / 'datasets' / 'cifar10' / 'cifar10-32x32.zip'}" in dry.stdout
    example = (Path(__file__).resolve().parents[2] / "templates" / "env.example").read_text()
    assert "DATA_ROOT_DIR=" in example


def test_eval_reads_a_run_directorys_samples_and_refuses_other_files(output_root: Path, tmp_path: Path) -> None:
    train = run_cli("train", "-c", "Toy/config_sft_toy", "-", *TINY, "trainer.max_iter=2", cwd=tmp_path)
    assert train.returncode == 0, train.stderr
    run_dir = output_root / "fastgen" / "toy" / "config_sft_toy"
    empty = run_cli("eval", str(run_dir), cwd=tmp_path)
    one_error_line(empty, 2, "no .npz files", "samples")
    sample = run_cli("sample", str(run_dir), "-n", "200", "--steps", "4", cwd=tmp_path)
    assert sample.returncode == 0, sample.stderr
    scored = run_cli("eval", str(run_dir), cwd=tmp_path)
    assert scored.returncode == 0, scored.stderr
    assert "energy_distance" in scored.stdout
    (tmp_path / "notes.txt").write_text("not samples\n")
    wrong = run_cli("eval", str(tmp_path / "notes.txt"), cwd=tmp_path)
    one_error_line(wrong, 2, "notes.txt is not an .npz file")

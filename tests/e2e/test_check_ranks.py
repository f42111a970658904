"""``fastgen check-ranks`` through the real launcher (torchrun's agent), with real gloo workers on CPU.

Two "nodes" are two launcher processes on loopback (``--nnodes 2 --node-rank 0/1 --rdzv-endpoint
127.0.0.1:PORT --nproc-per-node 1``), each started in its own working directory holding its own ``ckpt.pth``
(the same relative ``--checkpoint ckpt.pth``). Node 1's copy is a real checkpoint of a short ``fastgen train``
run, edited with torch.load / torch.save. Every process runs with a timeout, in its own session, and carries a
tag in its environment: afterwards every process with the tag (the launchers and the workers their agents start
in sessions of their own) is killed, so a failing test leaves nothing running.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fastgen_testing import FASTGEN, free_port, run_cli
from multirank import JOB_TAG as TAG
from multirank import tagged_pids

TIMEOUT = 240  # seconds for any one process (a slow, shared CPU)

CONFIG = '''
from omegaconf import DictConfig

from fastgen.configs.data import {loader}
from fastgen.configs.methods.config_sft import create_config as sft_config
from fastgen.configs.{net_module} import {net}


def create_config():
    config = sft_config()
    config.model.net = {net}({net_args})
    config.model.input_shape = {input_shape}
    config.model.num_classes = {num_classes}
    config.model.use_ema = True
    config.dataloader_train = {loader}({loader_args})
    config.dataloader_val = None
    config.trainer.max_iter = 1
    config.trainer.logging_iter = 1
    config.trainer.save_ckpt_iter = 1
    config.trainer.validation_iter = None
    config.trainer.callbacks = DictConfig({{}})
    config.log_config.name = "{name}"
    config.log_config.wandb_mode = "disabled"
    return config
'''
TOY_CONFIG = CONFIG.format(name="toy", net_module="net", net="toy_mlp", net_args="hidden_dim=32, num_layers=2",
                           input_shape=[2], num_classes=0, loader="toy_loader",
                           loader_args='"eight_gaussians", batch_size=16, num_samples=64')
# An EDM2 U-Net: its Fourier embeddings' frequencies and phases are persistent buffers, so checkpoints hold them.
EDM2_CONFIG = CONFIG.format(name="edm2", net_module="net_edm2", net="edm2_unet",
                            net_args="img_resolution=8, in_channels=1, num_classes=10, model_channels=8, "
                            "channel_mult=[1, 2]", input_shape=[1, 8, 8], num_classes=10, loader="digits_loader",
                            loader_args='split="train", batch_size=8')

BUFFER = "backbone.emb_fourier.freqs"
PARAMETER = "backbone.layers.1.weight"  # 32 x 32: rows 16:32 are rank 1's shard under FSDP on 2 ranks


# ---- processes -------------------------------------------------------------------------------------------------------
class Processes:
    """Start commands with a timeout each, in sessions of their own; ``kill_all`` ends every tagged process."""

    def __init__(self, env: dict[str, str]) -> None:
        self.tag = uuid.uuid4().hex
        self.env = {**os.environ, **env, TAG: self.tag, "OMP_NUM_THREADS": "1"}
        self.started: list[subprocess.Popen] = []

    def start(self, args: list[str], cwd: Path) -> subprocess.Popen:
        process = subprocess.Popen(args, cwd=cwd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, start_new_session=True)
        self.started.append(process)
        return process

    def finish(self, process: subprocess.Popen, timeout: float = TIMEOUT) -> tuple[int, str, str]:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_all()
            out, err = process.communicate()
            pytest.fail(f"{process.args} did not finish within {timeout} s:\n{out}\n{err}")
        return process.returncode, out, err

    def kill_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for pid in tagged_pids(self.tag):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def processes(output_root: Path) -> Iterator[Processes]:
    procs = Processes({"FASTGEN_OUTPUT_ROOT": str(output_root)})
    try:
        yield procs
    finally:
        procs.kill_all()


def check_ranks(*args: str) -> list[str]:
    return [FASTGEN, "check-ranks", *args]


def two_nodes(processes: Processes, workdir: Path, config: Path, *args: str) -> list[tuple[int, str, str]]:
    """Node 0 and node 1 on loopback, one worker each, each in its own directory (``workdir/node0``, ``node1``)."""
    endpoint = f"127.0.0.1:{free_port()}"
    started = [processes.start(check_ranks("-c", str(config), "--checkpoint", "ckpt.pth", "--nnodes", "2",
                                           "--node-rank", str(node), "--nproc-per-node", "1", "--rdzv-endpoint",
                                           endpoint, *args), cwd=workdir / f"node{node}") for node in (0, 1)]
    return [processes.finish(p) for p in started]


def mismatch_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("mismatch")]


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


# ---- checkpoints of real runs ------------------------------------------------------------------------------------------
def _train(tmp: Path, name: str, text: str) -> tuple[Path, Path]:
    config = tmp / f"{name}_cfg.py"
    config.write_text(text)
    root = tmp / "output"
    result = run_cli("train", f"--config={config}", cwd=tmp, env={"FASTGEN_OUTPUT_ROOT": str(root),
                                                                   "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    (checkpoint,) = sorted((root / "fastgen" / "default" / name / "checkpoints").glob("*.pth"))
    return config, checkpoint


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return _train(tmp_path_factory.mktemp("toy"), "toy", TOY_CONFIG)


@pytest.fixture(scope="module")
def edm2_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return _train(tmp_path_factory.mktemp("edm2"), "edm2", EDM2_CONFIG)


def node_dirs(tmp_path: Path, checkpoint: Path, edit=None) -> Path:
    """``tmp_path/node0/ckpt.pth`` (the checkpoint) and ``tmp_path/node1/ckpt.pth`` (edited by ``edit``)."""
    for node in (0, 1):
        (tmp_path / f"node{node}").mkdir()
    (tmp_path / "node0" / "ckpt.pth").write_bytes(checkpoint.read_bytes())
    payload = torch.load(checkpoint, weights_only=True)
    if edit is not None:
        edit(payload)
    torch.save(payload, tmp_path / "node1" / "ckpt.pth")
    return tmp_path


# ---- a consistent job -------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_consistent_ddp_job_on_two_ranks(processes: Processes, tmp_path: Path) -> None:
    code, out, err = processes.finish(processes.start(
        check_ranks("-c", "Toy/config_sft_toy", "--nproc-per-node", "2", "-", "trainer.ddp=True"), cwd=tmp_path))
    assert code == 0, out + err
    assert out.splitlines()[-1].strip() == "consistent"
    assert "all 2 rank(s) arrived" in out and "mismatch" not in out and not error_lines(err)
    assert re.search(r"consistent: (\d+) tensors as built, \1 replicated", out), out  # DDP: nothing sharded
    assert re.search(r"│ 0 .*│ 1 ", out, re.DOTALL), out  # a row per rank


@pytest.mark.slow
def test_consistent_fsdp_job_inside_torchrun_with_a_checkpoint_and_detail(processes: Processes, toy_run: tuple[Path, Path],
                                                                         tmp_path: Path) -> None:
    # model.meta_init: the trainer's own build (meta device, rank 0's weights broadcast into the shards)
    config, checkpoint = toy_run
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "fastgen",
               "check-ranks", "-c", str(config), "--checkpoint", str(checkpoint), "--detail", "-", "trainer.fsdp=True",
               "model.meta_init=True"]
    code, out, err = processes.finish(processes.start(command, cwd=tmp_path))
    assert code == 0, out + err
    assert out.splitlines()[-1].strip() == "consistent"
    assert re.search(r"consistent: \d+ replicated, \d+ shards against the full tensors, \d+ checkpoint tensors "
                     "as read", out), out  # nothing "as built": only rank 0 builds weights under meta_init
    assert out.count("DETAIL") == 2, out  # each worker restarted itself with TORCH_DISTRIBUTED_DEBUG=DETAIL


# ---- drift between the nodes' copies of the checkpoint -------------------------------------------------------------------
@pytest.mark.slow
def test_a_drifted_buffer_names_rank_1_and_the_buffer(processes: Processes, edm2_run: tuple[Path, Path],
                                                      tmp_path: Path) -> None:
    config, checkpoint = edm2_run

    def drift(payload: dict) -> None:
        payload["model"]["net"][BUFFER][0] += 1e-3

    (node0, out, err), (node1, _, err1) = two_nodes(processes, node_dirs(tmp_path, checkpoint, drift), config,
                                                    "-", "trainer.ddp=True")
    assert (node0, node1) == (1, 1), out + err + err1
    lines = mismatch_lines(out)
    assert all(" rank 1: " in line for line in lines), lines  # only rank 1 is at odds
    assert any(f"rank 1: buffer net.{BUFFER}: differs from rank 0" in line for line in lines), out + err + err1
    assert any(f"rank 1: checkpoint tensor model.net.{BUFFER} (buffer net.{BUFFER})" in line for line in lines), lines
    assert len(lines) == 2, lines
    for stderr in (err, err1):  # one line on each node, no traceback
        (line,) = error_lines(stderr)
        assert f"rank 1: buffer net.{BUFFER}" in line and "Traceback" not in stderr


@pytest.mark.slow
def test_a_drifted_sharded_parameter_names_rank_1_and_the_parameter(processes: Processes, toy_run: tuple[Path, Path],
                                                                    tmp_path: Path) -> None:
    config, checkpoint = toy_run

    def drift(payload: dict) -> None:
        payload["model"]["net"][PARAMETER][-1, 0] += 1e-3  # in rank 1's half

    (node0, out, err), (node1, _, err1) = two_nodes(processes, node_dirs(tmp_path, checkpoint, drift), config,
                                                    "-", "trainer.fsdp=True")
    assert (node0, node1) == (1, 1), out + err + err1
    lines = mismatch_lines(out)
    assert all(" rank 1: " in line for line in lines), lines
    assert any(f"rank 1: checkpoint tensor model.net.{PARAMETER} (sharded parameter net.{PARAMETER}): as read, "
               "differs from rank 0" in line for line in lines), lines
    # FSDP's load scatters rank 0's read: rank 1's shard is not what rank 1 read
    assert any(f"rank 1: sharded parameter net.{PARAMETER} [16:32, 0:32]: the local shard differs from the same "
               "slice of the checkpoint this rank read" in line for line in lines), lines
    assert len(lines) == 2, lines
    assert PARAMETER in error_lines(err)[0] and "Traceback" not in err + err1


# ---- a rank that never arrives -------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("stuck", [1, 0])
def test_a_stuck_rank_is_named_and_every_process_ends(processes: Processes, toy_run: tuple[Path, Path],
                                                      tmp_path: Path, stuck: int) -> None:
    config, checkpoint = toy_run
    node_dirs(tmp_path, checkpoint)
    (tmp_path / f"node{stuck}" / "ckpt.pth").unlink()
    os.mkfifo(tmp_path / f"node{stuck}" / "ckpt.pth")  # nobody writes: this rank's read blocks forever
    (node0, out, err), (node1, _, err1) = two_nodes(processes, tmp_path, config, "--timeout", "2", "-",
                                                    "trainer.ddp=True")
    assert (node0, node1) == (1, 1), out + err + err1
    assert "Traceback" not in err + err1 and "Exception raised from" not in err + err1
    if stuck == 1:  # rank 0 names it, after --timeout
        assert "rank 1 did not arrive at the barrier within 2 s" in out and "not run: a rank did not arrive" in out
        (line,) = error_lines(err)
        assert line.startswith("error: rank 1 did not arrive at the barrier within 2 s")
        assert "rank 1" in error_lines(err1)[0]
    else:  # rank 0 never comes: rank 1 names it after its longer wait, and rank 0 is stopped
        assert out == ""
        (line,) = error_lines(err1)
        assert line.startswith("error: rank 1: rank 0 did not arrive at the barrier")
        assert error_lines(err)[0].startswith("error: rank 0 stopped because rank 1: rank 0 did not arrive")
    deadline = time.monotonic() + 10  # the stuck worker was ended by its own failure watch, not by this test
    while tagged_pids(processes.tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert tagged_pids(processes.tag) == []


# ---- bad input: one line, exit 2, before any worker starts ------------------------------------------------------------------
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    cases = [
        (("-c", "Toy/config_sft_toy", "--checkpoint", "missing.pth", "--nproc-per-node", "2", "-", "trainer.ddp=True"),
         "--checkpoint missing.pth: no such file"),
        (("-c", "Toy/config_sft_toy", "--nproc-per-node", "2", "-", "trainer.ddp=True", "trainer.max_itr=3"),
         "unknown key 'trainer.max_itr'"),
        (("-c", "Toy/config_sft_toy", "--nproc-per-node", "2"), "trainer.ddp or trainer.fsdp"),
        (("-c", "Toy/config_sft_toy", "--nproc-per-node", "2", "--detail", "-", "trainer.ddp=True"),
         "cannot check a DDP config on CPU"),
        (("-c", "Toy/config_sft_toy", "--timeout", "0"), "--timeout must be positive"),
        (("-c", "Toy/config_sft_toy", "--checkpoint", "missing.pth"), "--checkpoint missing.pth: no such file"),
    ]  # the last one runs as a single process: the ranks' common failure (here, one rank's) is the error
    for args, expected in cases:
        result = run_cli("check-ranks", *args, cwd=tmp_path, timeout=120)
        assert result.returncode == 2, (args, result.stderr)
        assert error_lines(result.stderr) == result.stderr.strip().splitlines(), result.stderr  # one line
        assert len(error_lines(result.stderr)) == 1 and expected in result.stderr, result.stderr
        assert result.stdout == ""


def test_help_has_real_examples_and_the_command_is_listed() -> None:
    result = run_cli("check-ranks", "--help")
    assert result.returncode == 0
    assert "Examples" in result.stdout and "fastgen check-ranks -c Toy/config_sft_toy --nproc-per-node 2" in result.stdout
    assert "torchrun --nproc-per-node 8 -m fastgen check-ranks" in result.stdout
    assert "check-ranks" in run_cli("--help").stdout

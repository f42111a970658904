"""Helpers for tests: tiny configs that train in a fraction of a second, and a hook recorder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from ports import free_port  # noqa: F401 - re-exported: the tests import it from here

from fastgen.callbacks.callback import HOOKS, Callback
from fastgen.configs.callbacks import EMA_CALLBACK, GradClip_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.data import toy_loader
from fastgen.configs.methods.config_sft import create_config as sft_config
from fastgen.configs.net import toy_mlp

FASTGEN = str(Path(sys.executable).parent / "fastgen")


def tiny_toy_config(name: str = "tiny", max_iter: int = 6, **trainer: Any) -> BaseConfig:
    """An MLP on eight Gaussians: ~3k parameters, milliseconds per step."""
    config = sft_config()
    config.model.net = toy_mlp(hidden_dim=32, num_layers=1)
    config.model.input_shape = [2]
    config.model.use_ema = True
    config.dataloader_train = toy_loader("eight_gaussians", batch_size=16, num_samples=256)
    config.dataloader_val = toy_loader("eight_gaussians", batch_size=16, num_samples=64, seed=1)
    config.trainer.max_iter = max_iter
    config.trainer.logging_iter = 2
    config.trainer.save_ckpt_iter = 3
    config.trainer.validation_iter = None
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK, **EMA_CALLBACK})
    config.log_config.name = name
    config.log_config.wandb_mode = "disabled"
    for key, value in trainer.items():
        setattr(config.trainer, key, value)
    return config


class HookRecorder(Callback):
    """Records ``(hook, iteration)`` for every hook call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int | None]] = []

    def state_dict(self) -> dict[str, Any]:
        return {"n_calls": len(self.calls)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.restored = state_dict


class SecretHolder(Callback):
    """A callback configured with a secret (like a judge's API key)."""

    def __init__(self, api_key: str | None = None, note: str = "") -> None:
        self.api_key = api_key
        self.note = note


def _recorder(hook: str):
    def method(self: HookRecorder, *args: Any, **kwargs: Any) -> None:
        self.calls.append((hook, kwargs.get("iteration")))

    method.__name__ = hook
    return method


for _hook in HOOKS:
    setattr(HookRecorder, _hook, _recorder(_hook))


def state_tensors(checkpoint: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint's model and optimizer state, flattened by path."""
    flat: dict[str, torch.Tensor] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, torch.Tensor):
            flat[prefix] = node
        elif isinstance(node, dict):
            for key, value in node.items():
                walk(f"{prefix}.{key}", value)
        elif isinstance(node, (list, tuple)):
            for i, value in enumerate(node):
                walk(f"{prefix}.{i}", value)

    walk("model", checkpoint["model"])
    walk("optimizers", checkpoint["optimizers"])
    return flat


def assert_same_weights(path_a: Path, path_b: Path) -> None:
    """Two checkpoints hold bit-identical model and optimizer tensors."""
    from fastgen.checkpoint.checkpointer import load_checkpoint

    a, b = state_tensors(load_checkpoint(path_a)), state_tensors(load_checkpoint(path_b))
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs"


def assert_same_tree(a: Any, b: Any, where: str = "checkpoint") -> None:
    """Two nested structures are identical: tensors bit for bit (with dtype and shape), every other value by ``==``."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{where}: tensor vs {type(b).__name__}"
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype} {tuple(a.shape)} vs {b.dtype} {tuple(b.shape)}"
        assert torch.equal(a, b), f"{where} differs"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
        for key in a:
            assert_same_tree(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), f"{where}: {a!r} vs {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_tree(x, y, f"{where}.{i}")
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def assert_same_checkpoint(path_a: Path, path_b: Path) -> None:
    """Two checkpoints are identical in everything they hold: every module, optimizer and scheduler state, every
    random stream, the callbacks' and data loaders' state (tensors bit for bit, with dtype and shape)."""
    from fastgen.checkpoint.checkpointer import load_checkpoint

    assert_same_tree(load_checkpoint(path_a), load_checkpoint(path_b))


DIGITS_KILL_CONFIG = '''
import os
import signal

from omegaconf import DictConfig

from fastgen.callbacks.callback import Callback
from fastgen.configs.callbacks import EMA_CALLBACK
from fastgen.configs.data import image_zip_loader, webdataset_loader
from fastgen.configs.experiments.Digits.config_sft_digits import create_config as digits_teacher
from fastgen.configs.instantiate import LazyCall


class KillAt(Callback):
    def on_backward_begin(self, model, data_batch, output_batch, loss_dict, iteration=0, accum_iter=0):
        if os.environ.get("KILL_AT") == str(iteration):
            os.kill(os.getpid(), signal.SIGKILL)


def create_config():
    config = digits_teacher()
    config.model.net.backbone.model_channels = 8
    config.dataloader_train = LOADER
    config.dataloader_val = None
    config.trainer.max_iter = 10
    config.trainer.save_ckpt_iter = 4
    config.trainer.logging_iter = 5
    config.trainer.callbacks = DictConfig({**EMA_CALLBACK})
    config.trainer.callbacks.ema.type = "power"
    config.trainer.callbacks["kill"] = LazyCall(KillAt)()
    config.log_config.wandb_mode = "disabled"
    return config
'''


def assert_sigkill_resume_is_bit_identical(loader: str, tmp_path: Path, output_root: Path, env: dict[str, str]) -> None:
    """A small digits U-Net trained 10 iterations with the data loader ``loader`` (Python source, a
    ``fastgen.configs.data`` call), checkpoints every 4: a run SIGKILLed at iteration 6 and started again with the
    same command ends with the same checkpoint as an uninterrupted run (``assert_same_checkpoint``)."""
    import signal

    config = tmp_path / "kill_resume.py"
    config.write_text(DIGITS_KILL_CONFIG.replace("LOADER", loader))
    straight = run_cli("train", f"--config={config}", "-", "log_config.name=straight", cwd=tmp_path, env=env)
    assert straight.returncode == 0, straight.stderr
    command = ("train", f"--config={config}", "-", "log_config.name=killed")
    killed = run_cli(*command, cwd=tmp_path, env={**env, "KILL_AT": "6"})  # after the checkpoint at 4
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = run_cli(*command, cwd=tmp_path, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stderr
    final = "fastgen/digits/{}/checkpoints/0000010.pth"
    assert_same_checkpoint(output_root / final.format("straight"), output_root / final.format("killed"))


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run the installed ``fastgen`` command and capture its output."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([FASTGEN, *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


def interruptible() -> None:
    """``preexec_fn`` for a command a test presses Ctrl-C in: SIGINT at its default disposition and unblocked, as
    under a terminal, whatever the test process inherited (a suite started in the background ignores SIGINT;
    libraries block it around their own helper processes) - both are inherited across exec."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def shutdown_gloo() -> None:
    """Leave a test process group cleanly: a barrier first, so no rank tears down its connections while another
    is still using them (that race aborts the slower process with 'terminate called without an active
    exception')."""
    import torch.distributed as dist

    if dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()


def join_ranks(context: Any, timeout: float = 90.0) -> None:
    """Wait for ``torch.multiprocessing.start_processes(..., join=False)`` workers; kill them on timeout."""
    import time

    import pytest

    deadline = time.monotonic() + timeout
    try:
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                pytest.fail(f"the ranks did not finish within {timeout:.0f} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()


def exit_rank() -> None:
    """End a spawned test rank at once, after its results are written.

    Interpreter teardown would otherwise destroy leftover distributed objects (a DeviceMesh, DTensor
    parameters) in arbitrary order after the process group is gone, which sometimes aborts the process.
    """
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ---- W&B offline runs, and a tiny video model with camera poses (for the W&B media and log-module tests) --------
def read_wandb_history(run_dir: Path, timeout: float = 30.0) -> list[dict[str, Any]]:
    """The history rows (``run.log`` calls) of the one offline W&B run under ``run_dir/wandb``.

    Parses the run's ``.wandb`` transaction log: a 7-byte header (``:W&B``, magic, version), then LevelDB-log
    framing (32 KiB blocks; records of ``crc32 u32, length u16, type u8`` + payload, split FIRST/MIDDLE/LAST
    across blocks) around ``wandb_internal_pb2.Record`` protobufs. The installed wandb has no reader of its own
    (``wandb.sdk.internal.datastore`` is gone). Waits, bounded, for the run's exit record. The service may still
    be flushing after ``finish()`` returns, so a record caught half-written is read again on the next pass.
    """
    import json
    import struct
    import time

    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2

    runs = sorted(Path(run_dir, "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1, f"expected one offline W&B run under {run_dir}, found {runs}"
    deadline = time.monotonic() + timeout
    while True:
        data = runs[0].read_bytes()
        records, pending, pos, block = [], b"", 7, 32768
        assert data[:4] == b":W&B"
        while pos + 7 <= len(data):
            if block - pos % block < 7:
                pos += block - pos % block
                continue
            _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
            if pos + 7 + length > len(data):
                break  # the writer is mid-record: read again on the next pass
            chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
            if kind == 1:
                records.append(chunk)
            elif kind == 2:
                pending = chunk
            elif kind == 3:
                pending += chunk
            elif kind == 4:
                records.append(pending + chunk)
        parsed, torn = [], None
        for raw in records:
            record = wandb_internal_pb2.Record()
            try:
                record.ParseFromString(raw)
            except DecodeError as error:  # a record caught half-written (wandb-core flushes after finish())
                torn = error
                break
            parsed.append(record)
        if torn is None and any(r.WhichOneof("record_type") == "exit" for r in parsed):
            break
        if time.monotonic() > deadline:
            if torn is not None:
                raise torn
            break
        time.sleep(0.2)
    rows = []
    for record in parsed:
        if record.WhichOneof("record_type") == "history":
            rows.append({(item.key or "/".join(item.nested_key)): json.loads(item.value_json)
                         for item in record.history.item})
    return rows


class FlatMLPDenoiser(torch.nn.Module):
    """``MLPDenoiser`` on flattened samples of any shape (videos, audio) - a stand-in backbone for tests."""

    def __init__(self, shape: list[int], hidden_dim: int = 32, num_layers: int = 1) -> None:
        super().__init__()
        from fastgen.networks.mlp import MLPDenoiser

        self.shape = list(shape)
        self.mlp = MLPDenoiser(data_dim=int(torch.tensor(self.shape).prod()), hidden_dim=hidden_dim, num_layers=num_layers)

    def forward(self, x: torch.Tensor, c_noise: torch.Tensor, condition: Any = None, r_noise: Any = None,
                feature_indices: Any = None, return_logvar: bool = False) -> torch.Tensor:
        out = self.mlp(x.flatten(1), c_noise, condition=condition, r_noise=r_noise, return_logvar=return_logvar)
        return out.reshape(x.shape)


def circle_poses(frames: int, radius: float = 2.0, phase: float = 0.0, height: float = 0.5) -> torch.Tensor:
    """``(T, 4, 4)`` camera-to-world poses (OpenCV axes: x right, y down, z forward) on a circle of ``radius``
    in the x-z plane at height ``height`` (y = -height), each camera looking at the circle's centre."""
    import math

    poses = torch.zeros(frames, 4, 4)
    for t in range(frames):
        a = phase + 2 * math.pi * t / frames
        center = torch.tensor([radius * math.cos(a), -height, radius * math.sin(a)])
        forward = -center * torch.tensor([1.0, 0.0, 1.0])
        forward = forward / forward.norm()
        down = torch.tensor([0.0, 1.0, 0.0])
        right = torch.linalg.cross(down, forward)
        poses[t, :3, 0], poses[t, :3, 1], poses[t, :3, 2], poses[t, :3, 3] = right, down, forward, center
        poses[t, 3, 3] = 1.0
    return poses


class TinyVideoDataset:
    """Moving squares ``(3, T, H, W)`` in ``[-1, 1]`` with per-sample camera poses (a circle), intrinsics and
    2-D actions - the batch keys ``VipeLogger`` reads."""

    def __init__(self, num_samples: int = 64, frames: int = 4, size: int = 8) -> None:
        self.n, self.frames, self.size = num_samples, frames, size

    def __len__(self) -> int:
        return self.n

    def get_batch(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        import math

        b, t, s = len(indices), self.frames, self.size
        real = torch.full((b, 3, t, s, s), -1.0)
        poses = torch.zeros(b, t, 4, 4)
        actions = torch.zeros(b, t, 2)
        for row, i in enumerate(indices.tolist()):
            for f in range(t):
                x = (i + f) % (s - 2)
                real[row, i % 3, f, 2:5, x:x + 2] = 1.0
                angle = 2 * math.pi * (i + f) / 8
                actions[row, f] = torch.tensor([math.cos(angle), math.sin(angle)])
            poses[row] = circle_poses(t, phase=0.3 * i)
        intrinsics = torch.tensor([[10.0, 0.0, s / 2], [0.0, 10.0, s / 2], [0.0, 0.0, 1.0]]).expand(b, 3, 3).clone()
        return {"real": real, "camera_poses": poses, "intrinsics": intrinsics, "actions": actions}


def tiny_video_config(name: str = "tiny_video", max_iter: int = 4, frames: int = 4, size: int = 8, **trainer: Any) -> BaseConfig:
    """A flattened-MLP "video model" on ``TinyVideoDataset`` (``input_shape = [3, T, H, W]``), EMA on."""
    from fastgen.configs.instantiate import LazyCall
    from fastgen.configs.net import edm_schedule

    config = tiny_toy_config(name, max_iter=max_iter, **trainer)
    shape = [3, frames, size, size]
    config.model.input_shape = shape
    config.model.sample_steps = 2
    config.model.net = LazyCall("fastgen.networks.diffusion_net.DiffusionNet")(
        backbone=LazyCall("fastgen_testing.FlatMLPDenoiser")(shape=shape, hidden_dim=32, num_layers=1),
        noise_scheduler=edm_schedule(sigma_data=0.5),
    )
    loader = LazyCall("fastgen.datasets.loader.build_dataloader")
    config.dataloader_train = loader(dataset=LazyCall("fastgen_testing.TinyVideoDataset")(num_samples=64, frames=frames, size=size),
                                     batch_size=4, shuffle=True, seed=0)
    config.dataloader_val = None
    return config


class JudgeServer:
    """An OpenAI-compatible chat-completions endpoint on 127.0.0.1 for judge tests (a real HTTP server in a
    thread). Each request is recorded (``requests``: headers, path and JSON body) and answered by the next item of
    ``script`` (then ``default``): ``{"status": 200, "content": "Score: 7/10"}``, ``{"status": 500}``, or with
    ``"hold": threading.Event`` to wait (at most ``hold_timeout`` s) for the test to release it first."""

    def __init__(self, script: list[dict[str, Any]] | None = None, default: dict[str, Any] | None = None,
                 hold_timeout: float = 20.0) -> None:
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.script = list(script or [])
        self.default = default or {"status": 200, "content": '{"score": 7}'}
        self.holds = [a["hold"] for a in [*self.script, self.default] if a.get("hold") is not None]
        self.requests: list[dict[str, Any]] = []
        self.answered = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with server.lock:
                    server.requests.append({"path": self.path, "headers": dict(self.headers.items()),
                                            "body": json.loads(body)})
                    action = server.script.pop(0) if server.script else server.default
                if action.get("hold") is not None:
                    action["hold"].wait(hold_timeout)
                status = int(action.get("status", 200))
                if status == 200:
                    reply = {"id": "chatcmpl-test", "object": "chat.completion", "model": server.requests[-1]["body"].get("model"),
                             "choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant", "content": action.get("content", "")}}]}
                    payload = json.dumps(reply).encode()
                else:
                    payload = json.dumps({"error": {"message": f"test error {status}"}}).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:  # the client gave up (timeout test)
                    pass
                with server.lock:
                    server.answered += 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> JudgeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        for hold in self.holds:
            hold.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def wait_for(self, count: int, timeout: float = 20.0) -> None:
        """Block until ``count`` requests have arrived (raise after ``timeout`` s - a hang, not a timing check)."""
        import time

        deadline = time.monotonic() + timeout
        while len(self.requests) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"the judge server got {len(self.requests)} of {count} requests")
            time.sleep(0.01)


def write_cifar10_binary(folder: Path, per_file: int = 8, seed: int = 0,
                         files: tuple[str, ...] = ("data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                                                   "data_batch_4.bin", "data_batch_5.bin", "test_batch.bin"),
                         ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Write small files in CIFAR-10's binary format (records of 1 label byte + 3,072 CHW pixel bytes) into
    ``folder``; return ``{file name: (uint8 images (n, 3, 32, 32), int64 labels (n,))}`` as written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    written = {}
    for name in files:
        labels = torch.randint(0, 10, (per_file,), generator=g)
        images = torch.randint(0, 256, (per_file, 3, 32, 32), generator=g, dtype=torch.uint8)
        records = torch.cat([labels.to(torch.uint8)[:, None], images.reshape(per_file, -1)], dim=1)
        (folder / name).write_bytes(records.numpy().tobytes())
        written[name] = (images, labels)
    return written


def gloo_results(target: Any, out_dir: Path, world: int = 2, timeout: float = 90.0) -> list[dict[str, Any]]:
    """Run ``target(rank, world, port, out_dir)`` on ``world`` spawned ranks (each writes ``rank<r>.json`` with
    ``finish_rank``) and return their results in rank order."""
    import json

    import torch.multiprocessing as mp

    context = mp.start_processes(target, args=(world, free_port(), str(out_dir)), nprocs=world, join=False,
                                 start_method="spawn")
    join_ranks(context, timeout=timeout)
    return [json.loads((Path(out_dir) / f"rank{r}.json").read_text()) for r in range(world)]


def finish_rank(out_dir: str, rank: int, result: Any) -> None:
    """End a spawned test rank: leave the process group, write its result for ``gloo_results``, exit at once."""
    import json

    shutdown_gloo()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    exit_rank()


def two_iterations(config: Any, name: str, group: str | None = None, callbacks: dict[str, Any] | None = None) -> Any:
    """``config`` set for a test's short training run: 2 iterations, logged at each, checkpointed at the last, no
    validation, only ``callbacks`` (none by default), the run ``group/name`` (the recipe's group unless given)."""
    config.dataloader_val = None
    config.trainer.max_iter = 2
    config.trainer.logging_iter = 1
    config.trainer.save_ckpt_iter = 2
    config.trainer.callbacks = DictConfig(dict(callbacks or {}))
    if group is not None:
        config.log_config.group = group
    config.log_config.name = name
    return config


def run_in_process(*args: str) -> subprocess.CompletedProcess:
    """``fastgen ARGS`` in this process (``fastgen.cli.main.main``, what the console script calls), its output
    captured: the same code path and exit codes as ``run_cli`` without paying torch's import for every call."""
    import contextlib
    import io

    from fastgen.cli.main import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return subprocess.CompletedProcess(["fastgen", *args], code, stdout.getvalue(), stderr.getvalue())


def tiny_digits_recipe(method: str, net: DictConfig, name: str, iterations: int = 2, batch_size: int = 4) -> Any:
    """The digits recipe of ``method`` (``Digits/config_{method}_digits``: ``sft`` or ``dmd2``) around ``net`` (a
    tiny diffusers-backed network with a prompt bank for the 10 labels): ``iterations`` iterations logged each and
    checkpointed at the last, no W&B, EMA callback or validation; DMD2 takes its teacher from
    ``model.pretrained_model_path`` or the initial weights and trains the fake score and the student alternately."""
    from fastgen.configs.config_utils import load_config

    config = load_config(f"Digits/config_{method}_digits")
    config.model.net = net
    config.model.use_ema = method == "sft"
    config.trainer.max_iter = iterations
    config.trainer.logging_iter = 1
    config.trainer.save_ckpt_iter = iterations
    config.trainer.validation_iter = None
    config.dataloader_val = None
    config.dataloader_train.batch_size = batch_size
    config.trainer.callbacks = DictConfig({k: v for k, v in config.trainer.callbacks.items() if k not in ("wandb", "ema")})
    if method == "dmd2":
        config.model.teacher_ckpt = None
        config.model.student_update_freq = 2  # of every 2 iterations, one trains the fake score, one the student
    config.log_config.name = name
    return config


def encode_captioned_images(folder: Path, weights: Path, captions: list[str],
                            resolution: int = 16) -> tuple[list[Any], dict[str, dict[str, Any]], dict[str, Any]]:
    """``fastgen encode-data`` of one random ``resolution``-square image per caption (written under ``folder``) with
    the pipeline folder ``weights``, on the CPU: ``(the images as uint8 (R, R, 3) arrays, each caption's shard
    members as {field: array} - the ``.npy`` fields loaded - , the shards' index.json)``."""
    import json

    import numpy as np
    from PIL import Image

    photos = folder / "photos"
    photos.mkdir()
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (resolution, resolution, 3), dtype=np.uint8) for _ in captions]
    for i, (image, caption) in enumerate(zip(images, captions)):
        Image.fromarray(image).save(photos / f"{i}.png")
        (photos / f"{i}.txt").write_text(caption)
    shards = folder / "shards"
    result = run_in_process("encode-data", str(photos), str(shards), "--weights", str(weights),
                            "--resolution", str(resolution), "--device", "cpu")
    assert result.returncode == 0, result.stderr[-2000:]
    by_caption = {caption: {k: v for k, v in sample.items() if k not in ("txt", "json")}
                  for caption, sample in shard_samples(shards).items()}
    return images, by_caption, json.loads((shards / "index.json").read_text())


def shard_samples(folder: Path) -> dict[str, dict[str, Any]]:
    """Every sample of ``encode-data``'s shards in ``folder`` by its caption: ``{field: value}`` with the ``.npy``
    fields loaded (without pickles), ``txt`` the caption, ``json`` parsed."""
    import io
    import json
    import tarfile

    import numpy as np

    samples: dict[str, dict[str, Any]] = {}
    for shard in sorted(folder.glob("shard-*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar:
                key, field = member.name.split(".", 1)
                data = tar.extractfile(member).read()
                if field == "txt":
                    value: Any = data.decode()
                elif field == "json":
                    value = json.loads(data)
                else:
                    value = np.load(io.BytesIO(data), allow_pickle=False)
                samples.setdefault(f"{shard.name}/{key}", {})[field.removesuffix(".npy")] = value
    return {sample["txt"]: sample for sample in samples.values()}


def check_bank_labels_and_taps(net: Any, x: torch.Tensor, t: torch.Tensor, labels: torch.Tensor,
                               feature_shape: tuple[int, ...]) -> None:
    """The contract of a diffusers-backed network with a prompt bank, on ``(x, t)``: a label's prediction is that of
    its bank row passed as the condition (and another label's differs); feature taps (units 1 and 0) leave the
    prediction as it is and come back as ``feature_shape`` maps; a log-variance and taps outside the shard units are
    one-line ValueErrors."""
    import pytest

    with torch.no_grad():
        out = net(x, t, condition=labels)
        assert out.shape == x.shape
        torch.testing.assert_close(net(x, t, condition=net.backbone.prompt_bank[labels]), out, atol=1e-6, rtol=0)
        assert not torch.allclose(net(x, t, condition=(labels + 1) % len(net.backbone.prompt_bank)), out, atol=1e-4)
        pred, features = net(x, t, condition=labels, feature_indices=[1, 0])
    torch.testing.assert_close(pred, out, atol=1e-6, rtol=0)
    assert [tuple(f.shape) for f in features] == [tuple(feature_shape)] * 2
    with pytest.raises(ValueError, match="log-variance"):
        net(x, t, condition=labels, return_logvar=True)
    with pytest.raises(ValueError, match="feature_indices"):
        net(x, t, condition=labels, feature_indices=[len(net.backbone.shard_units())])


def sft_then_dmd2_from_its_folder(sft: BaseConfig, dmd2: BaseConfig, folder: Path) -> tuple[Any, Any]:
    """The real trainer runs ``sft``, its network is saved as the diffusers folder ``folder/transformer``, then runs
    ``dmd2`` from that folder (``model.pretrained_model_path``: teacher, student and fake score from it). Checks the
    teacher is exactly the SFT network's weights and the student and fake score moved; returns the two models."""
    from fastgen.trainer import Trainer

    first = Trainer(sft).run()
    first.net.backbone.model.save_pretrained(folder / "transformer")
    dmd2.model.pretrained_model_path = str(folder)
    second = Trainer(dmd2).run()
    tuned = first.net.backbone.model.state_dict()
    teacher = second.teacher.backbone.model.state_dict()
    for name, p in teacher.items():
        assert torch.equal(p, tuned[name]), name
    for name in ("net", "fake_score"):
        trained = getattr(second, name).backbone.model.state_dict()
        assert any(not torch.equal(v, teacher[k]) for k, v in trained.items()), name
    return first, second


def check_widened_heads(net: Any, x: torch.Tensor, t: torch.Tensor, condition: Any, heads: int = 3,
                        atol: float = 1e-5) -> None:
    """PDD's heads (``fastgen.networks.heads``) on a diffusers-backed network: its head projection (given random
    weights: diffusers zero-initialises some output layers) widened into ``heads`` copies gives ``heads``
    predictions ``(B, heads, *x.shape[1:])``, each the base network's; changing head 1's rows (``by_head`` /
    ``from_heads``: the backbone's layout) changes head 1's prediction only - each head's rows sit where the code
    after the projection reads that head's channels."""
    from fastgen.networks.heads import widen_output

    with torch.no_grad():
        projection = net.get_submodule("backbone." + net.backbone.head_projection().path)
        projection.weight.normal_(0, 0.1)
        base = net(x, t, condition=condition)
        widened = widen_output(net, heads, torch.linspace(1, 0, heads + 1))
        predictions = net(x, t, condition=condition)
        assert predictions.shape == (x.shape[0], heads, *x.shape[1:])
        for h in range(heads):
            torch.testing.assert_close(predictions[:, h], base, rtol=1e-4, atol=atol)
        by_head = widened.by_head(widened.weight.detach()).clone()
        by_head[1] += torch.randn_like(by_head[1])
        widened.weight.copy_(widened.from_heads(by_head))
        changed = net(x, t, condition=condition)
    for h in range(heads):
        if h != 1:
            torch.testing.assert_close(changed[:, h], base, rtol=1e-4, atol=atol)
    assert float((changed[:, 1] - base).abs().max()) > 1e-3


def check_checkpointing_and_lora(make_net: Any, x: torch.Tensor, t: torch.Tensor, condition: Any,
                                 targets: list[str], per_pattern: int = 2) -> set[str]:
    """Activation checkpointing of every shard unit (torch's composable ``checkpoint``, what
    ``model.activation_checkpointing`` applies) leaves the gradients of ``make_net()``'s networks as they are; a LoRA
    adapter on the modules matching ``targets`` (``per_pattern`` each: most tiny networks have two blocks) starts as
    the base network. Returns the adapted modules' paths whose parameters a backward reaches (only the LoRA branches
    train: the caller names which)."""
    from torch.distributed._composable import checkpoint

    from fastgen.utils.lora_utils import LoRAAdapter

    def gradients(net: Any) -> dict[str, torch.Tensor]:
        net(x, t, condition=condition).square().sum().backward()
        return {n: p.grad for n, p in net.named_parameters() if p.grad is not None}

    plain = gradients(make_net())
    net = make_net()
    for unit in net.backbone.shard_units():
        checkpoint(unit)
    checked = gradients(net)
    assert plain.keys() == checked.keys()
    for name, grad in plain.items():
        torch.testing.assert_close(checked[name], grad, atol=1e-6, rtol=1e-5)

    adapted = make_net()
    with torch.no_grad():
        before = adapted(x, t, condition=condition)
    assert len(LoRAAdapter(rank=2, target_modules=targets).apply(adapted)) == per_pattern * len(targets)
    with torch.no_grad():
        torch.testing.assert_close(adapted(x, t, condition=condition), before, atol=1e-6, rtol=0)
    trained = gradients(adapted)
    assert all(".lora." in name for name in trained), sorted(trained)
    return {name.split(".lora.")[0] for name in trained}


def random_frames(count: int, seed: int, size: int = 16) -> list[Any]:
    """``count`` random ``size x size`` RGB PIL frames (conditioning images and clips for video-to-world tests)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)) for _ in range(count)]

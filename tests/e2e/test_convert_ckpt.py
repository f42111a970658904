"""``fastgen convert-ckpt`` as users run it: a sharded checkpoint of a real 2-rank FSDP run, run directories as
SRC, S3 sources and destinations on a real SeaweedFS server, and bad input (one line, exit code, nothing at DST)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from fastgen_testing import assert_same_tree, run_cli, state_tensors, tiny_toy_config
from multirank import fastgen
from s3server import S3Server

from fastgen.checkpoint.checkpointer import load_checkpoint
from fastgen.trainer import Trainer

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def without_layout(payload: dict) -> dict:
    return {key: value for key, value in payload.items() if key != "layout"}


def one_line_error(result, code: int, *fragments: str) -> None:
    assert result.returncode == code, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    trainer = Trainer(tiny_toy_config("convert_e2e", max_iter=3))
    trainer.run()
    return trainer.run_dir


@pytest.mark.slow
def test_a_2_rank_fsdp_checkpoint_converts_to_the_pth_load_checkpoint_assembles(output_root: Path, tmp_path: Path) -> None:
    run = fastgen("train", "--nproc-per-node", "2", "-c", "Toy/config_sft_toy", "-", "trainer.fsdp=True",
                  "trainer.max_iter=2", "model.use_ema=true", "log_config.name=sharded",
                  "+trainer.callbacks.ema={_target_:fastgen.callbacks.ema.EMACallback,beta:0.9}", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    run_directory = output_root / "fastgen" / "toy" / "sharded"
    marker = run_directory / "checkpoints" / "0000002.pth"
    assert (run_directory / "checkpoints" / "0000002.dcp" / ".metadata").is_file()  # really sharded
    result = run_cli("convert-ckpt", str(run_directory), str(tmp_path / "full.pth"), cwd=tmp_path)  # a run dir as SRC
    assert result.returncode == 0, result.stderr
    assert "converted" in result.stdout and "0000002.pth" in result.stdout
    reference = load_checkpoint(marker)
    converted = load_checkpoint(tmp_path / "full.pth")
    assert converted["layout"] == "monolithic" and reference["layout"] == "sharded"
    assert {"net", "ema"} <= set(converted["model"]) and converted["optimizers"]
    assert_same_tree(without_layout(reference), without_layout(converted))
    # one network straight from the shards: a teacher file
    teacher = run_cli("convert-ckpt", str(marker), str(tmp_path / "teacher.safetensors"), "--only", "ema", cwd=tmp_path)
    assert teacher.returncode == 0, teacher.stderr
    from safetensors.torch import load_file

    assert_same_tree(reference["model"]["ema"], load_file(tmp_path / "teacher.safetensors"))
    # and back: the .pth as a sharded checkpoint again, in a checkpoints folder
    again = run_cli("convert-ckpt", str(tmp_path / "full.pth"), str(tmp_path / "resharded") + "/", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert_same_tree(state_tensors(reference), state_tensors(load_checkpoint(tmp_path / "resharded" / "0000002.pth")))


def test_cli_round_trips_and_teacher_export(run_dir: Path, tmp_path: Path) -> None:
    source = load_checkpoint(run_dir / "checkpoints" / "0000003.pth")
    steps = [
        ("convert-ckpt", str(run_dir / "checkpoints"), str(tmp_path / "a.dcp")),  # a checkpoints folder as SRC
        ("convert-ckpt", str(tmp_path / "a.dcp"), str(tmp_path / "b.pth")),
        ("convert-ckpt", str(tmp_path / "b.pth"), str(tmp_path / "c.safetensors")),
        ("convert-ckpt", str(run_dir), str(tmp_path / "teacher.pth"), "--only", "ema", "--dtype", "bfloat16"),
    ]
    for args in steps:
        result = run_cli(*args, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
    assert_same_tree(source, load_checkpoint(tmp_path / "b.pth"))
    from safetensors.torch import load_file

    flat = load_file(tmp_path / "c.safetensors")
    assert_same_tree({f"{n}.{k}": t for n, state in source["model"].items() for k, t in state.items()}, flat)
    teacher = load_checkpoint(tmp_path / "teacher.pth")
    assert_same_tree({k: t.to(torch.bfloat16) for k, t in source["model"]["ema"].items()}, teacher["model"]["net"])
    # the old script is a shim of the same conversion
    import subprocess
    import sys

    shim = subprocess.run([sys.executable, str(Path(__file__).parents[2] / "scripts" / "export_teacher.py"),
                           str(run_dir / "checkpoints" / "0000003.pth"), "--out", str(tmp_path / "shim.pth")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert shim.returncode == 0, shim.stderr
    assert_same_tree(source["model"]["ema"], load_checkpoint(tmp_path / "shim.pth")["model"]["net"])


def test_bad_input_is_one_line_with_its_exit_code_and_nothing_at_dst(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    ckpt = run_dir / "checkpoints" / "0000003.pth"
    (tmp_path / "junk.pth").write_text("junk")
    (tmp_path / "cut.pth").write_bytes(ckpt.read_bytes()[:-4096])
    payload = torch.load(ckpt, weights_only=True)
    first = next(iter(payload["model"]["ema"]))
    payload["model"]["ema"][first] = torch.zeros(1, 1)
    torch.save(payload, tmp_path / "mismatched.pth")
    cases = [
        ((str(tmp_path / "missing.pth"), str(out / "a.pth")), 2, ["checkpoint not found"]),
        ((str(tmp_path / "junk.pth"), str(out / "a.pth")), 1, ["corrupt or not a checkpoint"]),
        ((str(ckpt), str(out / "a.pth"), "--only", "fake_score"), 2, ["no network 'fake_score'", "it has: net, ema"]),
        ((str(ckpt), str(out / "a.pth"), "--to", "onnx"), 2, ["--to onnx"]),
        ((str(ckpt), str(out / "a.pth"), "--to", "dcp"), 2, ["does not fit"]),
        ((str(tmp_path / "cut.pth"), str(out / "a.pth")), 1, ["corrupt or truncated"]),
        ((str(tmp_path / "mismatched.pth"), str(out / "a.dcp")), 1, ["mismatched shapes", first]),
    ]
    for args, code, fragments in cases:
        one_line_error(run_cli("convert-ckpt", *args, cwd=tmp_path), code, *fragments)
    assert list(out.iterdir()) == []


def test_help_shows_examples() -> None:
    result = run_cli("convert-ckpt", "--help")
    assert result.returncode == 0
    assert "Examples" in result.stdout and "--only ema" in result.stdout and "s3://" in result.stdout
    assert "convert-ckpt" in run_cli("--help").stdout


def test_s3_source_and_destination(run_dir: Path, tmp_path: Path, s3_server: S3Server) -> None:
    env = {**s3_server.environment(), "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
    base = f"s3://{s3_server.bucket}/convert/{tmp_path.name}"
    source = load_checkpoint(run_dir / "checkpoints" / "0000003.pth")
    steps = [
        (str(run_dir), f"{base}/mono/0000003.pth"),  # local -> S3 object
        (f"{base}/mono", f"{base}/sharded/"),  # S3 prefix (its newest) -> S3 sharded layout (folder + marker)
        (f"{base}/sharded", str(tmp_path / "back.pth")),  # S3 sharded -> local
        (f"{base}/sharded/0000003.pth", str(tmp_path / "again.dcp")),  # S3 marker -> local sharded
    ]
    for src, dst in steps:
        result = run_cli("convert-ckpt", src, dst, cwd=tmp_path, env=env)
        assert result.returncode == 0, result.stderr
    keys = {item["Key"] for item in s3_server.client().list_objects_v2(
        Bucket=s3_server.bucket, Prefix=f"convert/{tmp_path.name}/sharded/")["Contents"]}
    prefix = f"convert/{tmp_path.name}/sharded/"
    assert f"{prefix}0000003.pth" in keys and f"{prefix}0000003.dcp/.metadata" in keys
    assert_same_tree(source, load_checkpoint(tmp_path / "back.pth"))
    assert_same_tree({**source, "layout": "sharded"}, load_checkpoint(tmp_path / "again.pth"))
    from fastgen.checkpoint.s3 import S3Location, S3Storage, newest_valid_checkpoint, resolve_credentials

    storage = S3Storage(resolve_credentials(environ=env))
    found = newest_valid_checkpoint(storage, S3Location.parse(f"{base}/sharded"))
    assert found is not None and found.iteration == 3 and found.folder is not None  # the trainer's S3 layout
    # an existing destination is refused and left alone; a missing source says so
    one_line_error(run_cli("convert-ckpt", str(run_dir), f"{base}/mono/0000003.pth", cwd=tmp_path, env=env), 2,
                   "never overwrites")
    one_line_error(run_cli("convert-ckpt", f"{base}/nothing", str(tmp_path / "x.pth"), cwd=tmp_path, env=env), 2,
                   "no valid checkpoint")
    assert not (tmp_path / "x.pth").exists()

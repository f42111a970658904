"""Checkpoint conversion (``fastgen.checkpoint.convert``) on checkpoints written by real training runs: exact round
trips through every format, ``only`` / ``dtype``, bounded pieces, and bad input that leaves nothing behind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from fastgen_testing import assert_same_tree, state_tensors, tiny_toy_config
from s3server import S3Server

from fastgen.checkpoint import convert
from fastgen.checkpoint.checkpointer import load_checkpoint
from fastgen.trainer import Trainer
from fastgen.utils.errors import CheckpointError, UsageError

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


@pytest.fixture
def trained(tmp_path: Path) -> Path:
    """A real monolithic checkpoint: a tiny toy run (net, EMA, Adam, a scheduler) of 3 iterations."""
    trainer = Trainer(tiny_toy_config("convert", max_iter=3))
    trainer.run()
    return trainer.run_dir / "checkpoints" / "0000003.pth"


def entries(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()} if folder.exists() else set()


@pytest.mark.parametrize("piece_bytes", [convert.PIECE_BYTES, 3000])  # one piece; many (each a dcp.save)
def test_pth_to_dcp_to_pth_round_trip_is_exact(trained: Path, tmp_path: Path, piece_bytes: int) -> None:
    source = load_checkpoint(trained)
    sharded = convert.convert_checkpoint(str(trained), str(tmp_path / "a.dcp"), piece_bytes=piece_bytes)
    assert sharded.format == "dcp" and sharded.marker == str(tmp_path / "a.pth")
    assert torch.load(tmp_path / "a.pth", weights_only=True)["layout"] == "sharded"
    assert source["layout"] == "monolithic"
    assert_same_tree({**source, "layout": "sharded"}, load_checkpoint(tmp_path / "a.pth"))
    back = convert.convert_checkpoint(str(tmp_path / "a.dcp"), str(tmp_path / "b.pth"), piece_bytes=piece_bytes)
    assert back.format == "pth" and back.tensors == len(state_tensors(source))
    assert_same_tree(source, load_checkpoint(tmp_path / "b.pth"))
    assert_same_tree(source, torch.load(tmp_path / "b.pth", weights_only=True, mmap=True))  # a plain torch file


def test_pth_to_safetensors_round_trip_is_exact(trained: Path, tmp_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import load_file

    source = load_checkpoint(trained)
    result = convert.convert_checkpoint(str(trained), str(tmp_path / "w.safetensors"), piece_bytes=3000)
    assert result.dropped[0] == "optimizers"
    flat = load_file(tmp_path / "w.safetensors")  # the safetensors package reads it
    expected = {f"{net}.{key}": tensor for net, state in source["model"].items() for key, tensor in state.items()}
    assert_same_tree(expected, flat)
    with safe_open(str(tmp_path / "w.safetensors"), framework="pt") as handle:
        assert handle.metadata()["iteration"] == "3"
    convert.convert_checkpoint(str(tmp_path / "w.safetensors"), str(tmp_path / "back.pth"))
    assert_same_tree(source["model"], load_checkpoint(tmp_path / "back.pth")["model"])


def test_only_ema_is_a_teacher_file_for_teacher_ckpt_and_pretrained_ckpt_path(trained: Path, tmp_path: Path) -> None:
    from fastgen.checkpoint.manager import restore_modules
    from fastgen.checkpoint.weights import load_network_state

    source = load_checkpoint(trained)
    net, ema = source["model"]["net"], source["model"]["ema"]
    assert any(not torch.equal(net[k], ema[k]) for k in net)  # the test can tell them apart
    result = convert.convert_checkpoint(str(trained.parent), str(tmp_path / "teacher.pth"), only="ema")
    assert result.networks == ["net"] and "optimizers" in result.dropped
    teacher = load_checkpoint(tmp_path / "teacher.pth")
    assert list(teacher["model"]) == ["net"] and "optimizers" not in teacher
    assert teacher["source"] == "0000003.pth:ema (iteration 3)"
    assert_same_tree(ema, load_network_state(str(tmp_path / "teacher.pth")))  # what model.teacher_ckpt loads
    from fastgen.configs.instantiate import instantiate

    config = tiny_toy_config("fresh")
    model = instantiate(config.model_class, config=config.model)
    restore_modules(model, teacher, tmp_path / "teacher.pth", allow_missing=True)  # what pretrained_ckpt_path does
    assert_same_tree(ema, {k: v for k, v in model.net.state_dict().items()})
    # the same network as a bare safetensors state dict
    convert.convert_checkpoint(str(trained), str(tmp_path / "teacher.safetensors"), only="ema")
    from safetensors.torch import load_file

    assert_same_tree(ema, load_file(tmp_path / "teacher.safetensors"))


def test_dtype_casts_network_weights_and_keeps_optimizer_state(trained: Path, tmp_path: Path) -> None:
    source = load_checkpoint(trained)
    convert.convert_checkpoint(str(trained), str(tmp_path / "half.pth"), dtype="bfloat16")
    half = load_checkpoint(tmp_path / "half.pth")
    for net, state in source["model"].items():
        for key, tensor in state.items():
            assert half["model"][net][key].dtype == torch.bfloat16
            assert torch.equal(half["model"][net][key], tensor.to(torch.bfloat16))
    assert_same_tree(source["optimizers"], half["optimizers"])


def test_pieces_stay_within_the_piece_size(trained: Path) -> None:
    """The streaming contract: no read asks for more than ``piece_bytes`` (unless one tensor is larger)."""
    source = convert.open_source(trained)
    reads: list[int] = []
    original = source.read

    def recording(paths: list[Any]) -> dict[Any, torch.Tensor]:
        found = original(paths)
        reads.append(sum(t.numel() * t.element_size() for t in found.values()))
        assert len(paths) == 1 or reads[-1] <= 5000
        return found

    source.read = recording  # type: ignore[method-assign]
    _, leaves, _ = convert.plan_output(source.payload, "pth", None, None, "x")
    assert sum(len(piece) for piece in convert.pieces(source, leaves, piece_bytes=5000)) == len(leaves)
    assert len(reads) > 3 and sum(reads) == sum(leaf.spec.nbytes for leaf in leaves)


def test_unknown_only_names_the_networks_there_are(trained: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"has no network 'fake_score' \(it has: net, ema\)"):
        convert.convert_checkpoint(str(trained), str(tmp_path / "x.pth"), only="fake_score")
    assert entries(tmp_path) == set()


def test_bad_input_is_a_usage_error_and_leaves_nothing(trained: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    torch.save({"hello": "world"}, tmp_path / "other.pth")
    cases = [
        (str(tmp_path / "missing.pth"), str(out / "a.pth"), {}, "checkpoint not found"),
        (str(tmp_path / "other.pth"), str(out / "a.pth"), {}, "not a fastgen checkpoint"),
        (str(trained), str(out / "a.bin"), {}, "cannot tell the format"),
        (str(trained), str(out / "a.pth"), {"to": "dcp"}, "does not fit"),
        (str(trained), str(out / "a.pth"), {"to": "zip"}, "expected one of pth, dcp, safetensors"),
        (str(trained), str(out / "a.pth"), {"dtype": "int8"}, "--dtype int8"),
        (str(trained), str(trained), {}, "never overwrites"),
    ]
    for src, dst, options, message in cases:
        with pytest.raises(UsageError, match=message):
            convert.convert_checkpoint(src, dst, **options)
    # a file that is not a torch zip at all is a corrupt checkpoint (exit 1), as the README says
    with pytest.raises(CheckpointError, match="corrupt or not a checkpoint"):
        convert.convert_checkpoint(str(tmp_path / "notes.txt"), str(out / "a.pth"))
    assert entries(out) == set()


def test_mismatched_keys_and_corrupt_data_are_checkpoint_errors_and_leave_nothing(trained: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    payload = torch.load(trained, weights_only=True)
    dropped = next(iter(payload["model"]["ema"]))
    del payload["model"]["ema"][dropped]
    torch.save(payload, tmp_path / "mismatched.pth")
    with pytest.raises(CheckpointError, match=f"network 'ema' does not match 'net'.*{dropped}.*mismatched keys"):
        convert.convert_checkpoint(str(tmp_path / "mismatched.pth"), str(out / "a.pth"))
    (tmp_path / "truncated.pth").write_bytes(trained.read_bytes()[:-4096])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        convert.convert_checkpoint(str(tmp_path / "truncated.pth"), str(out / "a.pth"))
    # a sharded checkpoint whose shard file is cut short: the failure comes mid-write, after the first pieces
    convert.convert_checkpoint(str(trained), str(tmp_path / "s.dcp"))
    shard = next((tmp_path / "s.dcp").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    for name in ("a.pth", "a.dcp", "a.safetensors"):
        with pytest.raises(CheckpointError):
            convert.convert_checkpoint(str(tmp_path / "s.dcp"), str(out / name), piece_bytes=3000)
    assert entries(out) == set()


def test_a_bare_state_dict_is_the_weights_of_net(tmp_path: Path) -> None:
    state = {"w": torch.randn(3, 4), "b": torch.arange(4)}
    torch.save(state, tmp_path / "bare.pth")
    result = convert.convert_checkpoint(str(tmp_path / "bare.pth"), str(tmp_path / "c.dcp"))
    assert result.networks == ["net"]
    assert_same_tree(state, load_checkpoint(tmp_path / "c.pth")["model"]["net"])


def test_a_folder_destination_gets_the_iteration_name(trained: Path, tmp_path: Path) -> None:
    convert.convert_checkpoint(str(trained), str(tmp_path / "ckpts") + "/", to="dcp")
    assert entries(tmp_path / "ckpts") == {"0000003.dcp", "0000003.pth"}
    from fastgen.checkpoint.checkpointer import Checkpointer

    assert Checkpointer(str(tmp_path / "ckpts"), tmp_path).latest() == tmp_path / "ckpts" / "0000003.pth"


def test_a_failed_s3_upload_leaves_nothing_at_the_destination(trained: Path, tmp_path: Path, s3_server: S3Server,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The marker's upload fails (after the shards and .metadata went up): every uploaded object is deleted."""
    from fastgen.checkpoint import s3

    for key, value in s3_server.environment().items():
        monkeypatch.setenv(key, value)
    real_upload = s3.S3Storage.upload_file

    def failing_marker(self: s3.S3Storage, path: Any, location: Any) -> None:
        if str(location).endswith(".pth"):
            raise s3.S3UnreachableError(f"S3 endpoint did not answer while uploading to {location}")
        real_upload(self, path, location)

    monkeypatch.setattr(s3.S3Storage, "upload_file", failing_marker)
    prefix = f"convert-fail/{tmp_path.name}"
    with pytest.raises(CheckpointError, match="did not answer"):
        convert.convert_checkpoint(str(trained), f"s3://{s3_server.bucket}/{prefix}/", to="dcp",
                                   credentials_dir=tmp_path / "none")
    listed = s3_server.client().list_objects_v2(Bucket=s3_server.bucket, Prefix=prefix)
    assert listed.get("KeyCount", 0) == 0, [item["Key"] for item in listed.get("Contents", [])]

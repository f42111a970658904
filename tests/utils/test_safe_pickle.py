"""The project's one unpickler (``fastgen.utils.safe_pickle``) and the DCP metadata checks built on it: exact names
only, no dotted walk, no code run; a DCP folder's metadata cannot point outside the folder or declare more bytes
than the folder holds. The same corpus goes through every command in ``tests/e2e/test_hostile_checkpoints*.py``."""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import pytest
import torch
from hostile_files import (
    build_allowed_pickle,
    dotted_global_pickle,
    reduce_allowed_pickle,
    stack_global_dotted_pickle,
)

from fastgen.utils import safe_pickle
from fastgen.utils.errors import CheckpointError

REPO = Path(__file__).resolve().parents[2]


class RunsCode:
    def __init__(self, sentinel: Path) -> None:
        self.sentinel = sentinel

    def __reduce__(self):  # noqa: ANN204
        import os

        return (os.system, (f"touch {self.sentinel}",))


def test_the_allowlist_holds_exact_names_only() -> None:
    assert all("." not in name and module and name for module, name in safe_pickle.ALLOWED)


@pytest.mark.parametrize("module", ["torch.serialization", "torch.distributed.checkpoint.filesystem", "pathlib",
                                    "collections"])
def test_a_dotted_name_under_an_allowed_module_is_refused(module: str, tmp_path: Path) -> None:
    sentinel = tmp_path / "ran"
    for data in (dotted_global_pickle(module, sentinel), stack_global_dotted_pickle(module, sentinel)):
        with pytest.raises(safe_pickle.UnsafePickleError, match=rf"names {module}\.os\.system"):
            safe_pickle.loads(data)
    assert not sentinel.exists()


def test_a_reduce_payload_is_refused(tmp_path: Path) -> None:
    with pytest.raises(safe_pickle.UnsafePickleError, match=r"names posix\.system"):
        safe_pickle.loads(pickle.dumps(RunsCode(tmp_path / "ran")))
    assert not (tmp_path / "ran").exists()


def test_allowed_callables_given_hostile_arguments_fail_without_effect() -> None:
    with pytest.raises(AttributeError):  # a tensor rebuilt from a string: torch refuses it
        safe_pickle.loads(reduce_allowed_pickle())
    with pytest.raises(TypeError):  # BUILD re-pointing an OrderedDict's class
        safe_pickle.loads(build_allowed_pickle())


def test_a_persistent_id_outside_torch_load_is_refused() -> None:
    class WithPid(pickle.Pickler):
        def persistent_id(self, obj: object) -> object:
            return "x" if obj == "external" else None

    import io

    data = io.BytesIO()
    WithPid(data).dump(["external"])
    with pytest.raises(safe_pickle.UnsafePickleError, match="persistent id"):
        safe_pickle.loads(data.getvalue())


def test_plain_data_only_mode_refuses_every_name() -> None:
    with pytest.raises(safe_pickle.UnsafePickleError, match=r"collections\.OrderedDict"):
        safe_pickle.loads(pickle.dumps({"a": __import__("collections").OrderedDict()}), allowed=frozenset())
    assert safe_pickle.loads(pickle.dumps({"a": [1, 2.0, "x", None]}), allowed=frozenset()) == {"a": [1, 2.0, "x", None]}


def test_torch_load_reads_what_fastgen_saves(tmp_path: Path) -> None:
    """Every kind of value a checkpoint holds: tensors of several dtypes, optimizer state, random streams, bytes,
    sets, sizes and devices (protocol 2 names them by their Python 2 names)."""
    import random

    net = torch.nn.Linear(3, 3)
    optimizer = torch.optim.Adam(net.parameters())
    net(torch.randn(2, 3)).sum().backward()
    optimizer.step()
    payload = {"model": net.state_dict(), "optimizer": optimizer.state_dict(), "torch": torch.get_rng_state(),
               "python": random.getstate(), "bf16": torch.ones(2, dtype=torch.bfloat16), "bytes": b"\x00\xff",
               "set": {1, 2}, "size": torch.Size([2, 3]), "device": torch.device("cpu"),
               "parameter": torch.nn.Parameter(torch.ones(2))}
    torch.save(payload, tmp_path / "ok.pth")
    for mmap in (False, True):
        loaded = safe_pickle.torch_load(tmp_path / "ok.pth", mmap=mmap)
        assert loaded.keys() == payload.keys()
        assert torch.equal(loaded["model"]["weight"], payload["model"]["weight"])
        assert loaded["optimizer"]["param_groups"] == payload["optimizer"]["param_groups"]
        assert loaded["python"] == payload["python"] and loaded["bytes"] == b"\x00\xff" and loaded["set"] == {1, 2}
        assert loaded["bf16"].dtype == torch.bfloat16 and loaded["size"] == torch.Size([2, 3])


def test_torch_load_refuses_in_one_line_without_the_weights_only_hint(tmp_path: Path) -> None:
    torch.save({"model": RunsCode(tmp_path / "ran")}, tmp_path / "evil.pth")
    with pytest.raises(CheckpointError) as refused:
        safe_pickle.torch_load(tmp_path / "evil.pth", what="model.teacher_ckpt=evil.pth")
    message = str(refused.value)
    assert "\n" not in message and "model.teacher_ckpt=evil.pth" in message and "names posix.system" in message
    assert "weights_only" not in message and not (tmp_path / "ran").exists()
    (tmp_path / "text.pth").write_text("hello")
    with pytest.raises(safe_pickle.CorruptFileError, match="no zip directory"):
        safe_pickle.torch_load(tmp_path / "text.pth")


def test_no_message_in_the_product_suggests_weights_only_false() -> None:
    """No string literal in the library or the CLI says ``weights_only=False`` (torch's own hint is never passed
    on: every torch.load goes through ``safe_pickle.torch_load``)."""
    offenders = []
    for path in [*(REPO / "fastgen").rglob("*.py"), *(REPO / "cli").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "weights_only=False" in node.value:
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "load"
                    and getattr(node.func.value, "id", None) == "torch" and path.name != "safe_pickle.py"):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno} calls torch.load")
    assert offenders == []


# ---- DCP metadata ---------------------------------------------------------------------------------------------------
@pytest.fixture
def dcp_folder(tmp_path: Path) -> Path:
    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "ckpt.dcp"
    dcp.save({"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(3), "lr": 0.1}, checkpoint_id=str(folder),
             no_dist=True)
    return folder


def read(folder: Path):  # noqa: ANN201
    from fastgen.checkpoint.dcp_safe import SafeFileSystemReader

    return SafeFileSystemReader(str(folder)).read_metadata()


def rewrite(folder: Path, change) -> None:  # noqa: ANN001
    metadata = read(folder)
    change(metadata)
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))


def test_a_valid_folder_reads_and_loads(dcp_folder: Path) -> None:
    from fastgen.checkpoint.checkpointer import read_sharded_as_full

    state = read_sharded_as_full(dcp_folder)
    assert torch.equal(state["w"], torch.arange(6.0).reshape(2, 3)) and state["lr"] == 0.1


def test_metadata_naming_a_file_outside_the_folder_is_refused(dcp_folder: Path) -> None:
    def outside(metadata) -> None:  # noqa: ANN001
        for info in metadata.storage_data.values():
            info.relative_path = "../" + info.relative_path

    rewrite(dcp_folder, outside)
    with pytest.raises(CheckpointError, match="outside its folder"):
        read(dcp_folder)


def test_metadata_declaring_more_bytes_than_the_folder_holds_is_refused(dcp_folder: Path) -> None:
    def longer(metadata) -> None:  # noqa: ANN001
        info = next(iter(metadata.storage_data.values()))
        info.length = 10**12

    rewrite(dcp_folder, longer)
    with pytest.raises(CheckpointError, match="the folder is incomplete or the metadata was altered"):
        read(dcp_folder)


def test_a_tensor_larger_than_its_chunks_is_refused(dcp_folder: Path) -> None:
    rewrite(dcp_folder, lambda metadata: setattr(metadata.state_dict_metadata["b"], "size", torch.Size([10**12])))
    with pytest.raises(CheckpointError, match="do not cover its declared size"):
        read(dcp_folder)


def test_a_chunk_larger_than_its_storage_is_refused(dcp_folder: Path) -> None:
    def grow(metadata) -> None:  # noqa: ANN001
        entry = metadata.state_dict_metadata["b"]
        entry.size = torch.Size([10**9])
        entry.chunks[0].sizes = torch.Size([10**9])

    rewrite(dcp_folder, grow)
    with pytest.raises(CheckpointError, match="more than its storage holds"):
        read(dcp_folder)


def test_a_tensor_entry_is_read_by_the_safe_unpickler(dcp_folder: Path, tmp_path: Path) -> None:
    """DCP stores each tensor as a small ``torch.save``: a hostile one there is refused too (DCP's own reader
    would use torch's weights-only unpickler, a second set of rules)."""
    import io

    from fastgen.checkpoint.checkpointer import read_sharded_as_full

    metadata = read(dcp_folder)
    index, info = next((i, s) for i, s in metadata.storage_data.items() if i.fqn == "b")
    evil = io.BytesIO()
    torch.save(RunsCode(tmp_path / "ran"), evil)
    shard = dcp_folder / info.relative_path
    data = shard.read_bytes()
    shard.write_bytes(data + evil.getvalue())

    def point_at_evil(metadata) -> None:  # noqa: ANN001
        entry = metadata.storage_data[index]
        entry.offset, entry.length = len(data), len(evil.getvalue())

    rewrite(dcp_folder, point_at_evil)
    with pytest.raises(CheckpointError, match=r"names posix\.system"):
        read_sharded_as_full(dcp_folder)
    assert not (tmp_path / "ran").exists()

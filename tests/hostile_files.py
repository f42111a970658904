"""A corpus of hostile checkpoint files: each would run code, read outside its folder or ask for terabytes if a
reader trusted it. Every payload that runs code creates ``sentinel`` (a file the tests then check never appears).

``pth_*`` cases are one ``.pth`` file; ``meta_*`` cases are a sharded checkpoint (a marker ``.pth`` and its
``.dcp`` folder) whose ``.metadata`` is the hostile part. Built from a real checkpoint of the run being tested
(``base_pth``) and a real sharded conversion of it (``base_marker``), so everything but the hostile part is valid.
"""

from __future__ import annotations

import collections
import io
import os
import pickle
import shutil
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

PTH_CASES = ("pth_reduce", "pth_dotted_global", "pth_stack_global_dotted", "pth_reduce_allowed",
             "pth_build_allowed", "pth_huge")
META_CASES = ("meta_reduce", "meta_dotted_global", "meta_outside_folder", "meta_huge")
CASES = PTH_CASES + META_CASES


def _shell(sentinel: Path) -> str:
    return f"touch {sentinel}"


class _RunsCode:
    """``__reduce__``: unpickling it calls ``os.system``."""

    def __init__(self, sentinel: Path) -> None:
        self.sentinel = sentinel

    def __reduce__(self):  # noqa: ANN204
        return (os.system, (_shell(self.sentinel),))


def _text_op(text: str) -> bytes:
    return b"V" + text.encode() + b"\n"


def dotted_global_pickle(module: str, sentinel: Path) -> bytes:
    """Protocol 0: ``GLOBAL module os.system`` then ``REDUCE`` - a dotted name under an allowed module (pickle
    resolves it through the module's own ``import os``)."""
    return b"c" + module.encode() + b"\nos.system\n(" + _text_op(_shell(sentinel)) + b"tR."


def stack_global_dotted_pickle(module: str, sentinel: Path) -> bytes:
    """Protocol 4: the same through ``STACK_GLOBAL`` (module and name pushed as strings)."""
    def short(text: str) -> bytes:
        data = text.encode()
        return b"\x8c" + bytes([len(data)]) + data

    return (b"\x80\x04" + short(module) + short("os.system") + b"\x93" + short(_shell(sentinel)) + b"\x85R.")


def reduce_allowed_pickle() -> bytes:
    """``REDUCE`` on an allowed callable with arguments it was never meant to get: a tensor rebuilt from a string."""
    return pickle.dumps(_Reduced(), protocol=2)


class _Reduced:
    def __reduce__(self):  # noqa: ANN204
        return (torch._utils._rebuild_tensor_v2, ("storage?", 0, (4,), (1,), False, collections.OrderedDict()))


def build_allowed_pickle() -> bytes:
    """``BUILD`` on an allowed class: an OrderedDict whose slot state re-points its ``__class__``."""
    inner = pickle.dumps(collections.OrderedDict(), protocol=2)[:-1]  # drop STOP
    state = pickle.dumps(({"format": "fastgen-checkpoint"}, {"__class__": torch.Size}), protocol=2)
    state = state[2:-1]  # drop PROTO and STOP
    return inner + state + b"b."


def replace_data_pkl(base: Path, target: Path, data: bytes) -> None:
    """``target``: ``base`` (a torch zip) with its ``data.pkl`` replaced by ``data``."""
    with zipfile.ZipFile(base) as source, zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as out:
        for info in source.infolist():
            out.writestr(info.filename, data if info.filename.endswith("/data.pkl") else source.read(info.filename))


class _StoragePlaceholder:
    pass


class _HugeTensor:
    def __init__(self, numel: int) -> None:
        self.numel = numel

    def __reduce__(self):  # noqa: ANN204
        return (torch._utils._rebuild_tensor_v2,
                (_StoragePlaceholder(), 0, (self.numel,), (1,), False, collections.OrderedDict()))


class _HugePickler(pickle.Pickler):
    """Declares storage ``"0"`` (which the archive holds, a few bytes long) as ``numel`` float32 elements."""

    def __init__(self, file: io.BytesIO, numel: int) -> None:
        super().__init__(file, protocol=2)
        self.numel = numel

    def persistent_id(self, obj: object) -> object:
        if isinstance(obj, _StoragePlaceholder):
            return ("storage", torch.FloatStorage, "0", "cpu", self.numel)
        return None


def huge_pth(target: Path, numel: int = 10**12) -> None:
    """A ``.pth`` whose one tensor declares ``numel`` elements in a storage of 16 bytes."""
    base = target.with_name(".base_huge.pth")
    torch.save({"w": torch.zeros(4)}, base)
    data = io.BytesIO()
    _HugePickler(data, numel).dump({"format": "fastgen-checkpoint", "model": {"net": {"w": _HugeTensor(numel)}}})
    replace_data_pkl(base, target, data.getvalue())
    base.unlink()


def _metadata(folder: Path):  # noqa: ANN202
    from fastgen.utils.safe_pickle import SafeUnpickler

    with (folder / ".metadata").open("rb") as handle:
        return SafeUnpickler(handle).load()


def make_case(case: str, folder: Path, base_pth: Path, base_marker: Path, sentinel: Path) -> Path:
    """Write case ``case`` into ``folder`` as ``folder/0000002.pth`` (plus ``0000002.dcp/`` for ``meta_*``) and
    return the ``.pth``'s path."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "0000002.pth"
    if case == "pth_reduce":
        torch.save({"format": "fastgen-checkpoint", "iteration": 2, "model": {"net": _RunsCode(sentinel)}}, target)
    elif case == "pth_dotted_global":
        replace_data_pkl(base_pth, target, dotted_global_pickle("torch.serialization", sentinel))
    elif case == "pth_stack_global_dotted":
        replace_data_pkl(base_pth, target, stack_global_dotted_pickle("pathlib", sentinel))
    elif case == "pth_reduce_allowed":
        replace_data_pkl(base_pth, target, reduce_allowed_pickle())
    elif case == "pth_build_allowed":
        replace_data_pkl(base_pth, target, build_allowed_pickle())
    elif case == "pth_huge":
        huge_pth(target)
    elif case in META_CASES:
        shutil.copy(base_marker, target)
        dcp = folder / "0000002.dcp"
        shutil.copytree(base_marker.with_suffix(".dcp"), dcp)
        if case == "meta_reduce":
            (dcp / ".metadata").write_bytes(pickle.dumps(_RunsCode(sentinel)))
        elif case == "meta_dotted_global":
            (dcp / ".metadata").write_bytes(dotted_global_pickle("torch.distributed.checkpoint.filesystem", sentinel))
        elif case == "meta_outside_folder":
            metadata = _metadata(dcp)
            for info in metadata.storage_data.values():
                outside = folder / f"outside_{info.relative_path}"
                shutil.copy(dcp / info.relative_path, outside)
                info.relative_path = f"../{outside.name}"
            (dcp / ".metadata").write_bytes(pickle.dumps(metadata))
        elif case == "meta_huge":
            metadata = _metadata(dcp)
            entry = next(e for e in metadata.state_dict_metadata.values() if len(getattr(e, "size", ())) == 1)
            entry.size = torch.Size([10**12])
            (dcp / ".metadata").write_bytes(pickle.dumps(metadata))
    else:
        raise ValueError(case)
    return target


# ---- the corpus as the command-line tests use it ------------------------------------------------------------------
#: What the one line must say, per case: the name the pickle asked for, or why the file is refused.
EXPECTED = {
    "pth_reduce": "names posix.system",
    "pth_dotted_global": "names torch.serialization.os.system",
    "pth_stack_global_dotted": "names pathlib.os.system",
    "pth_reduce_allowed": "corrupt",
    "pth_build_allowed": "corrupt",
    "pth_huge": "corrupt",
    "meta_reduce": "names posix.system",
    "meta_dotted_global": "names torch.distributed.checkpoint.filesystem.os.system",
    "meta_outside_folder": "outside its folder",
    "meta_huge": "do not cover its declared size",
}


@dataclass
class Corpus:
    root: Path
    output_root: Path
    base_pth: Path
    base_marker: Path
    env: dict[str, str]

    def sentinel(self, case: str) -> Path:
        return self.root / f"PWNED_{case}"


def build_corpus(root: Path) -> Corpus:
    from fastgen_testing import run_cli

    """A real 2-iteration toy run and a sharded conversion of its checkpoint: what the cases are made from."""
    output_root = root / "out"
    env = {"FASTGEN_OUTPUT_ROOT": str(output_root)}
    trained = run_cli("train", "-c", "Toy/config_sft_toy", "-", "trainer.max_iter=2", "trainer.save_ckpt_iter=2",
                      "log_config.name=base", cwd=root, env=env)
    assert trained.returncode == 0, trained.stderr[-3000:]
    base_pth = output_root / "fastgen" / "toy" / "base" / "checkpoints" / "0000002.pth"
    converted = run_cli("convert-ckpt", str(base_pth), str(root / "sharded" / "0000002.dcp"), cwd=root, env=env)
    assert converted.returncode == 0, converted.stderr[-3000:]
    return Corpus(root, output_root, base_pth, root / "sharded" / "0000002.pth", env)




def assert_refused(result: subprocess.CompletedProcess, case: str, corpus: Corpus, what: str) -> None:
    """One line, exit 1, the case's reason; no mention of ``weights_only``; the payload never ran."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1, f"{what}: exit {result.returncode}\n{result.stderr[-3000:]}"
    assert len(lines) == 1 and lines[0].startswith("error: "), f"{what}: not one line:\n{result.stderr[-3000:]}"
    assert EXPECTED[case] in lines[0], f"{what}: {lines[0]}"
    assert "weights_only" not in result.stderr + result.stdout, what
    assert not corpus.sentinel(case).exists(), f"{what}: the payload ran"

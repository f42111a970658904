"""Every command's edges, one row per case (issue "every command's edges"): the real ``fastgen`` command, its exit
code (0 ok, 1 runtime failure, 2 usage or config error), a phrase its one error line must contain, and what must
not exist afterwards. The README's exit-code paragraph is the contract each row checks."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from fastgen_testing import run_cli, tiny_toy_config

LORA = "model.net_adapter={{_target_:fastgen.utils.lora_utils.LoRAAdapter,rank:2,alpha:2}}"  # braces doubled: format()


@dataclass(frozen=True)
class Case:
    """``args`` may hold ``{name}`` placeholders for the world's paths; ``absent`` are paths (placeholders too)
    that must not exist afterwards; ``unchanged`` files keep their bytes."""

    id: str
    args: tuple[str, ...]
    code: int
    phrase: str
    absent: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    traceback: bool = False  # FASTGEN_DEBUG=1: the traceback comes before the one line


CASES = [
    # -- usage errors of the command line itself: one line, exit 2 (also with FASTGEN_DEBUG=1)
    Case("unknown-option", ("train", "--foo"), 2, "No such option: --foo"),
    Case("bad-option-value", ("train", "--eval-samples", "x"), 2, "Invalid value for '--eval-samples'"),
    Case("unknown-command", ("trian",), 2, "No such command 'trian'"),
    Case("nproc-zero", ("train", "-c", "Toy/config_sft_toy", "--nproc-per-node", "0"), 2, "--nproc-per-node",
         absent=("{root}/fastgen/toy",)),
    Case("debug-keeps-usage-code", ("train", "--config=missing.py"), 2, "config file not found: missing.py",
         env={"FASTGEN_DEBUG": "1"}, traceback=True),
    Case("max-restarts-on-gloo", ("train", "-c", "Toy/config_sft_toy", "--nproc-per-node", "2", "--max-restarts", "1",
                                  "-", "trainer.ddp=True", "trainer.device=cpu"), 2, "--max-restarts needs CUDA",
         absent=("{root}/fastgen/toy",)),
    # -- configs: the key to change is named, nothing is created
    Case("max-iter-zero", ("train", "-c", "Toy/config_sft_toy", "-", "trainer.max_iter=0"), 2, "trainer.max_iter=0",
         absent=("{root}/fastgen/toy",)),
    Case("device-without-cuda", ("train", "-c", "Toy/config_sft_toy", "-", "trainer.device=cuda:99"), 2,
         "trainer.device=cuda:99", absent=("{root}/fastgen/toy",)),
    Case("missing-teacher", ("train", "-c", "Toy/config_dmd2_toy", "-", "model.teacher_ckpt={tmp}/nope/teacher.pth"),
         2, "model.teacher_ckpt: {tmp}/nope/teacher.pth does not exist", absent=("{root}/fastgen/toy",)),
    Case("teacher-is-a-folder", ("train", "-c", "Toy/config_dmd2_toy", "-", "model.teacher_ckpt={tmp}"), 2,
         "model.teacher_ckpt: {tmp} is a folder", absent=("{root}/fastgen/toy",)),
    Case("teacher-mismatch", ("train", "-c", "Toy/config_dmd2_toy", "-", "model.teacher_ckpt={ckpt}"), 1,
         "do not fit model.teacher: missing 4 keys (backbone.layers.1.weight", absent=("{root}/fastgen/toy",)),
    Case("missing-lora-base", ("train", "-c", "Toy/config_sft_toy", "-", LORA,
                               "trainer.checkpointer.pretrained_ckpt_path={tmp}/base.pth"), 2,
         "trainer.checkpointer.pretrained_ckpt_path: {tmp}/base.pth does not exist", absent=("{root}/fastgen/toy",)),
    Case("config-is-a-folder", ("train", "--config", "{run}"), 2, "is a folder: this run's config is {run}/config.yaml"),
    Case("s3-one-slash-override", ("train", "-c", "Toy/config_sft_toy", "-", "trainer.checkpointer.save_dir=s3:/bucket/k"),
         2, "not an S3 URL", absent=("{tmp}/s3:", "{root}/fastgen/toy")),
    # -- convert-ckpt
    Case("convert-s3-one-slash", ("convert-ckpt", "{ckpt}", "s3:/bucket/k.pth"), 2, "not an S3 URL",
         absent=("{tmp}/s3:",)),
    Case("convert-garbage", ("convert-ckpt", "{tmp}/garbage.pth", "{tmp}/out.pth"), 1, "corrupt or not a checkpoint",
         absent=("{tmp}/out.pth",)),
    Case("convert-to-proc", ("convert-ckpt", "{ckpt}", "/proc/fastgen-test/x.pth"), 2, "cannot write the destination"),
    Case("convert-under-a-file", ("convert-ckpt", "{ckpt}", "{tmp}/a_file/x.pth"), 2, "{tmp}/a_file is a file"),
    Case("convert-missing-shard", ("convert-ckpt", "{tmp}/sharded.pth", "{tmp}/from_sharded.pth"), 1,
         "not in the checkpoint folder", absent=("{tmp}/from_sharded.pth",)),
    Case("convert-never-overwrites", ("convert-ckpt", "{ckpt}", "{tmp}/garbage.pth"), 2, "never overwrites",
         unchanged=("{tmp}/garbage.pth",)),
    # -- ema: what cannot be reconstructed is refused, -o is never overwritten
    Case("ema-past-newest", ("ema", "{snaps}", "--sigma-rel", "0.08", "--at", "999999", "-o", "{tmp}/e.pth"), 2,
         "past the newest snapshot", absent=("{tmp}/e.pth",)),
    Case("ema-between-snapshots", ("ema", "{snaps}", "--sigma-rel", "0.08", "--at", "25", "-o", "{tmp}/e.pth"), 2,
         "between snapshots", absent=("{tmp}/e.pth",)),
    Case("ema-error-bound", ("ema", "{snaps}", "--sigma-rel", "0.25", "-o", "{tmp}/e.pth"), 2,
         "above --max-error 0.05", absent=("{tmp}/e.pth",)),
    Case("ema-never-overwrites", ("ema", "{snaps}", "--sigma-rel", "0.08", "-o", "{tmp}/garbage.pth"), 2,
         "never overwrites", unchanged=("{tmp}/garbage.pth",)),
    Case("ema-ok", ("ema", "{snaps}", "--sigma-rel", "0.08", "-o", "{tmp}/ema_ok.pth"), 0, ""),
    # -- eval: outputs checked before any work, too few samples refused
    Case("eval-few-samples", ("eval", "{tmp}/many.npz"), 0, "use at least 1000"),
    Case("eval-one-sample", ("eval", "{tmp}/one.npz"), 2, "at least 2 samples"),
    Case("eval-json-is-a-folder", ("eval", "{tmp}/many.npz", "--json", "{tmp}"), 2, "--json {tmp} is a folder"),
    Case("eval-json-under-a-file", ("eval", "{tmp}/many.npz", "--json", "{tmp}/a_file/m.json"), 2,
         "{tmp}/a_file is a file"),
    Case("eval-json-unwritable", ("eval", "{tmp}/many.npz", "--json", "/proc/fastgen-test/m.json"), 2,
         "Choose another --json path"),
    # -- sample: -o checked before the run is loaded
    Case("sample-out-under-a-file", ("sample", "{run}", "-o", "{tmp}/a_file/s.npz"), 2, "{tmp}/a_file is a file"),
    # -- init
    Case("init-over-a-folder", ("init", "{tmp}/configs"), 2, "is a folder", absent=("{tmp}/configs.py",)),
    Case("init-from-missing-file", ("init", "{tmp}/new_cfg", "--from", "{tmp}/nope.py"), 2,
         "no built-in recipe or config file", absent=("{tmp}/new_cfg.py",)),
]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The files the cases act on: a trained toy run, its checkpoint, a sharded copy missing a shard, EMA snapshots,
    sample files, a garbage .pth, a plain file to write under and an existing folder."""
    from fastgen.checkpoint.convert import convert_checkpoint
    from fastgen.trainer import Trainer
    from fastgen.utils.posthoc_ema import gamma_from_sigma_rel, save_snapshot, snapshot_path

    tmp = tmp_path_factory.mktemp("edges")
    root = tmp / "output"
    previous = os.environ.get("FASTGEN_OUTPUT_ROOT")
    os.environ["FASTGEN_OUTPUT_ROOT"] = str(root)
    try:
        config = tiny_toy_config("edges", max_iter=3)
        run = Path(config.log_config.save_path)
        Trainer(config).run()
    finally:
        if previous is None:
            os.environ.pop("FASTGEN_OUTPUT_ROOT")
        else:
            os.environ["FASTGEN_OUTPUT_ROOT"] = previous
    ckpt = run / "checkpoints" / "0000003.pth"
    assert ckpt.is_file(), sorted(run.rglob("*"))
    convert_checkpoint(str(ckpt), str(tmp / "sharded.dcp"))
    shards = sorted((tmp / "sharded.dcp").glob("*.distcp"))
    assert shards, sorted(tmp.iterdir())
    shards[0].unlink()
    snaps = tmp / "snaps"
    state = {"w": torch.ones(4, 4), "b": torch.zeros(4)}
    for t in (10, 20, 30, 40):
        for name, sigma in (("ema_005", 0.05), ("ema_010", 0.10)):
            save_snapshot(snapshot_path(snaps, name, t), {k: v * t for k, v in state.items()}, t,
                          gamma_from_sigma_rel(sigma))
    rng = np.random.default_rng(0)
    np.savez(tmp / "one.npz", arr_0=rng.integers(0, 256, (1, 8, 8, 1), dtype=np.uint8))
    np.savez(tmp / "many.npz", arr_0=rng.integers(0, 256, (64, 8, 8, 1), dtype=np.uint8))
    (tmp / "garbage.pth").write_bytes(b"not a checkpoint at all")
    (tmp / "a_file").write_text("a plain file")
    (tmp / "configs").mkdir()
    return {"tmp": str(tmp), "root": str(root), "run": str(run), "ckpt": str(ckpt),
            "snaps": str(snaps / "ema_snapshots")}


def _fill(text: str, world: dict[str, str]) -> str:
    return text.format(**world)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_command_edge(case: Case, world: dict[str, str]) -> None:
    args = [_fill(a, world) for a in case.args]
    unchanged = {path: Path(path).read_bytes() for path in (_fill(p, world) for p in case.unchanged)}
    env = {"FASTGEN_OUTPUT_ROOT": world["root"], "DATA_ROOT_DIR": world["tmp"], **case.env}
    result = run_cli(*args, cwd=Path(world["tmp"]), env=env)
    assert result.returncode == case.code, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if case.code == 0:  # a phrase is then a warning the command must print
        assert not any(line.startswith("error:") for line in lines), result.stderr
        assert _fill(case.phrase, world) in result.stderr, result.stderr
    else:
        errors = [line for line in lines if line.startswith("error:")]
        assert len(errors) == 1, result.stderr
        assert _fill(case.phrase, world) in errors[0], (case.phrase, errors[0])
        if case.traceback:
            assert "Traceback (most recent call last):" in result.stderr and lines[-1] == errors[0], result.stderr
        else:
            assert lines == errors, result.stderr  # the error line and nothing else
    for path in case.absent:
        assert not Path(_fill(path, world)).exists(), f"{_fill(path, world)} was left behind"
    for path, content in unchanged.items():
        assert Path(path).read_bytes() == content, f"{path} was overwritten"


def test_every_case_is_a_distinct_row() -> None:
    assert len({c.id for c in CASES}) == len(CASES)


def test_help_shows_one_spelling_and_both_are_accepted(world: dict[str, str]) -> None:
    """--help lists --log-level once (not --log_level); the underscore spelling still works."""
    for command in ("train", "ema", "convert-ckpt", "dryrun", "sample", "eval"):
        text = run_cli(command, "--help").stdout
        assert "--log-level" in text and "--log_level" not in text, (command, text)
    result = run_cli("ema", world["snaps"], "--sigma-rel", "0.08", "-o", f"{world['tmp']}/ema_underscore.pth",
                     "--log_level", "ERROR", cwd=Path(world["tmp"]))
    assert result.returncode == 0, result.stderr
    assert "--nproc_per_node" not in run_cli("train", "--help").stdout

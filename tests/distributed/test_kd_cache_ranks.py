"""KD's teacher pairs are built by every rank, not by rank 0 while the others wait (issue 32, point 3): rank ``r``
solves batches ``r, r + W, ...`` and rank 0 joins the parts into the file a single process writes, byte for byte
in its tensors. Under FSDP the teacher is sharded, so its forward is a collective and the rank with fewer batches
must keep solving in step (5 batches over 2 ranks here): a hang there ends the test by its timeout."""

from __future__ import annotations

from pathlib import Path

import torch

from multirank import fastgen


def test_two_fsdp_ranks_split_the_kd_cache_and_write_the_one_process_file(output_root: Path, tmp_path: Path) -> None:
    from fastgen.configs.config_utils import load_config
    from fastgen.configs.instantiate import instantiate
    from fastgen.methods.kd import KDPairsDataset, build_kd_dataset

    config = load_config("Toy/config_kd_toy")
    torch.manual_seed(3)
    teacher = tmp_path / "teacher.pth"
    torch.save(instantiate(config.model.net).state_dict(), teacher)
    pairs = tmp_path / "pairs.pt"
    overrides = [f"model.teacher_ckpt={teacher}", f"model.kd_data_path={pairs}", f"dataloader_train.dataset.path={pairs}",
                 "model.kd_num_samples=300", "model.kd_build_batch_size=64", "model.sample_steps=4",
                 "dataloader_train.batch_size=32", "trainer.max_iter=2", "trainer.save_ckpt_iter=100",
                 "log_config.name=kd_ranks"]
    result = fastgen("train", "--nproc-per-node", "2", "-c", "Toy/config_kd_toy", "--log_level", "INFO", "-",
                     "trainer.fsdp=True", *overrides, cwd=tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "this rank: 3 of 5 batches" in result.stderr + result.stdout  # rank 0 solved its share only
    assert not list(tmp_path.glob(".pairs.pt.part*"))  # the parts are gone once joined

    config.model.teacher_ckpt, config.model.sample_steps = str(teacher), 4
    model = instantiate(config.model_class, config=config.model)
    model.init_weights()
    alone = build_kd_dataset(model, tmp_path / "alone.pt", 300, 64, seed=config.model.kd_seed)
    split, one = KDPairsDataset(str(pairs)), KDPairsDataset(str(alone))
    assert torch.equal(split.noise, one.noise) and torch.equal(split.trajectory, one.trajectory)

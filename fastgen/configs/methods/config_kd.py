"""Method config for knowledge distillation (Luhman & Luhman 2021). See ``fastgen.methods.kd``.

The student learns the teacher's deterministic ODE map from noise to sample. Teacher pairs come from one of:

* a cache file (``kd_data_path``): built by ``fastgen.methods.kd.build_kd_dataset`` - automatically at the start of
  a fresh run when the file is missing - and read by ``fastgen.methods.kd.KDPairsDataset`` as the training data
  (set ``dataloader_train`` to ``kd_pairs_loader(path)``; the two paths must agree);
* no cache (``kd_data_path=None``): the teacher solves fresh noise for every batch (the data loader only sets the
  batch size and, for conditional models, the labels) - simple and never stale, but every step pays a full teacher
  solve, so it suits small teachers (the 2-D toy MLP).

Typical use (see ``fastgen/configs/experiments/Digits/config_kd_digits.py``)::

    from fastgen.configs.methods.config_kd import create_config, kd_pairs_loader
    config = create_config()
    config.model.net = ...
    config.model.teacher_ckpt = "teacher.pth"
    config.model.t_list = [80.0, 1.0]        # a 2-step student (default: 1 step from t_max)
    config.model.kd_data_path = "kd_pairs.pt"
    config.dataloader_train = kd_pairs_loader("kd_pairs.pt", batch_size=64)
"""

from __future__ import annotations

from typing import Literal, Optional

from omegaconf import DictConfig

from fastgen.configs.config import BaseConfig
from fastgen.configs.instantiate import LazyCall
from fastgen.configs.methods.config_distill import DistillModelConfig
from fastgen.configs.schema import config_class


@config_class
class KDModelConfig(DistillModelConfig):
    kd_data_path: Optional[str] = None  # cache of teacher pairs (built on a fresh run if missing); None: on the fly
    kd_num_samples: int = 10_000  # pairs written when the cache is built
    kd_build_batch_size: int = 500  # teacher batch while building the cache
    kd_seed: int = 0  # noise and labels of the cache
    kd_teacher_steps: Optional[int] = None  # the teacher's Heun steps (None: sample_steps)
    # Regression on each student step's x0 estimate (l2) or its pseudo-Huber distance (iCT's c = 0.00054 sqrt(D)).
    distance: Literal["l2", "pseudo_huber"] = "l2"
    huber_c: Optional[float] = None


def _kd_class() -> DictConfig:
    return LazyCall("fastgen.methods.kd.KDModel")()


def kd_pairs_loader(path: str, batch_size: int = 64, seed: int = 0) -> DictConfig:
    """The training loader over a KD cache file (``model.kd_data_path``)."""
    return LazyCall("fastgen.datasets.loader.build_dataloader")(
        dataset=LazyCall("fastgen.methods.kd.KDPairsDataset")(path=path),
        batch_size=batch_size, shuffle=True, seed=seed,
    )


def create_config() -> BaseConfig:
    """A base KD config; experiment configs fill in the networks, the teacher checkpoint and the data."""
    return BaseConfig(model=KDModelConfig(), model_class=_kd_class())


__all__ = ["KDModelConfig", "create_config", "kd_pairs_loader"]

# fastgen/configs/experiments/EDM/config_dmd2_fast_small.py
from fastgen.configs.experiments.EDM.config_dmd2_fast import create_config as base_create_config
def create_config():
    config = base_create_config()
    config.dataloader_train.batch_size = 32
    return config

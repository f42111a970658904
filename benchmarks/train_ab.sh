#!/bin/sh
# 200 iterations of the digits DMD2 quick-start as one whole process, in a fresh run directory, for A/B timing of
# two checkouts with farm-bench. PYTHONPATH (second argument) puts another checkout's `fastgen` package ahead of
# the editable install, so one .venv times both:
#   git worktree add /tmp/old fc2d21b
#   farm-bench -n 3 --timeout 800 --vs "benchmarks/train_ab.sh ab_old /tmp/old" -- benchmarks/train_ab.sh ab_new
# usage: benchmarks/train_ab.sh NAME [PYTHONPATH]
set -e
cd "$(dirname "$0")/.."
rm -rf "FASTGEN_OUTPUT/fastgen/digits/$1"
PYTHONPATH="${2:-}" FASTGEN_NO_PROGRESS=1 exec .venv/bin/fastgen train --eval-samples 0 - log_config.wandb_mode=disabled \
    "log_config.name=$1" trainer.max_iter=200 trainer.save_ckpt_iter=1000 >"/tmp/train_ab_$1.log" 2>&1

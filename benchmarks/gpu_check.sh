#!/usr/bin/env bash
# GPU check: one CUDA GPU, NCCL initialised at world size 1, FSDP2 with bf16 mixed precision, and the training
# speed. Run from the repository root on a machine with a CUDA GPU, after `make setup` (or with the project
# installed in the active environment):
#
#   bash benchmarks/gpu_check.sh            # prints the checks and the steps/s; exit 0 when all pass
#
# It trains the digits SFT recipe for 300 iterations through `torchrun --nproc-per-node 1 -m fastgen train` with
# trainer.fsdp=True (every network sharded by FSDP2 over a 1-rank NCCL mesh) and FSDP's mixed-precision policy
# all-gathering parameters in bfloat16 (master weights and optimizer state stay float32), then reads the
# trainer's log: the process group's backend, the sharded networks, and the steps/s of the last 100 iterations.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
TORCHRUN="$(dirname "$PY")/torchrun"
"$PY" - <<'PYCHECK'
import torch
assert torch.cuda.is_available(), "no CUDA GPU visible"
assert torch.distributed.is_nccl_available(), "this torch has no NCCL"
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, "
      f"{torch.cuda.get_device_name(0)}")
PYCHECK
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
FASTGEN_OUTPUT_ROOT="$work" WANDB_MODE=disabled FASTGEN_NO_PROGRESS=1 \
  "$TORCHRUN" --standalone --nproc-per-node 1 -m fastgen train -c Digits/config_sft_digits --log_level DEBUG - \
  trainer.fsdp=True trainer.fsdp_param_dtype=bfloat16 trainer.fsdp_reduce_dtype=float32 trainer.max_iter=300 \
  trainer.logging_iter=100 trainer.validation_iter=null trainer.save_ckpt_iter=300 log_config.name=gpu_check \
  2>&1 | tee "$work/log" | grep -E "iteration [0-9]+/300|error" || true
fail=0
grep -q "joined the process group (nccl" "$work/log" && echo "ok: NCCL process group at world size 1" || { echo "FAIL: no NCCL process group"; fail=1; }
grep -q "sharded net with FSDP2" "$work/log" && echo "ok: networks sharded with FSDP2" || { echo "FAIL: nothing sharded"; fail=1; }
grep -q "module net: .*DiffusionNet.*cuda" "$work/log" && echo "ok: the network is on the GPU" || { echo "FAIL: network not on CUDA"; fail=1; }
rate=$(grep -oE "iteration 300/300 +loss [0-9.]+ +[0-9.]+ it/s" "$work/log" | grep -oE "[0-9.]+ it/s" || true)
[ -n "$rate" ] && echo "steps/s (iterations 201-300, batch 64): ${rate% it/s}" || { echo "FAIL: the run did not finish"; fail=1; }
exit $fail

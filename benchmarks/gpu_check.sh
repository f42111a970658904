#!/usr/bin/env bash
# GPU check: fastgen on one CUDA GPU - NCCL at world size 1, FSDP2 (bf16 mixed precision, CPU offload), async
# sharded checkpoints and their resume, and the training speed against a hand-written bf16 loop. Run from the
# repository root on a machine with a CUDA GPU, after `make setup` (or with the project installed in the active
# environment):
#
#   bash benchmarks/gpu_check.sh     # prints ok/FAIL per check and a summary table; exit 0 when all pass
#
# Expected to take 2-4 minutes on one H200 (six stages, each mostly process start-up plus a few seconds of training).
#
# Every stage runs under `timeout`, and all stages together under a budget of GPU_CHECK_BUDGET_S seconds (default
# 450): a stage that hangs is killed and fails, and the ones after it get what is left of the budget.
#
# Stages (the digits SFT recipe Digits/config_sft_digits, batch 64, ITERS=300 iterations unless GPU_CHECK_ITERS):
#  1. probe   torchrun --nproc-per-node 1 benchmarks/gpu_probe.py (fastgen's init_distributed, parallelize and
#             CheckpointManager in-process): collective_device() (and fingerprint's) is cuda:LOCAL_RANK under NCCL
#             and an all-reduce works; torch.cuda.current_device() == LOCAL_RANK and the process group is bound to
#             cuda:LOCAL_RANK (the device_id given to init_process_group); one FSDP2 step computes with bf16 weights
#             while master weights and gradients stay float32; an async sharded save stages into pinned host
#             buffers (ReusedHostStager), reuses them at the next save and loads back exactly; with
#             trainer.fsdp_cpu_offload the shards live in host memory, forward runs on the GPU and a step trains.
#  2. fsdp    torchrun --nproc-per-node 1 -m fastgen train, trainer.fsdp=True with bf16 all-gather / float32
#             reduction and trainer.checkpointer.async_save=True: from the DEBUG log, the NCCL process group, the
#             sharded networks, the network on the GPU in float32, the steps/s of the last ITERS/3 iterations, the
#             async save at ITERS (log line and the marker + DCP folder with .metadata).
#  3. resume  the same command with trainer.max_iter=ITERS+20: "resumed from .../<ITERS>.pth (iteration ITERS)",
#             the 20 further iterations and their checkpoint.
#  4. offload 30 iterations with trainer.fsdp_cpu_offload=True: the network's parameters on the CPU in the log,
#             the run finishes with a finite loss.
#  5. amp     one process (no torchrun, no FSDP), model.precision_amp=bfloat16: the steps/s of the same window.
#  6. hand    benchmarks/gpu_handloop.py: the same network, batch, Adam and SFT loss in a plain torch.autocast(bf16)
#             loop (and the same plus gradient clipping and EMA, what the recipe's callbacks add); the ratios
#             fastgen steps/s / hand-loop steps/s.
#
# Environment: PYTHON (interpreter; default .venv/bin/python), GPU_CHECK_ITERS, GPU_CHECK_BUDGET_S,
# GPU_CHECK_KEEP=1 (keep the work folder with the logs), GPU_CHECK_ALLOW_CPU=1 (self-test of this script on a
# machine without a GPU: gloo and CPU are expected instead of NCCL and CUDA, the offload run is skipped, 30
# iterations, budget 1500 s; its figures mean nothing).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
TORCHRUN="$(dirname "$PY")/torchrun"
[ -x "$TORCHRUN" ] || TORCHRUN=torchrun
ALLOW_CPU=${GPU_CHECK_ALLOW_CPU:-0}
if [ "$ALLOW_CPU" = 1 ]; then BACKEND=gloo DEV=cpu ITERS=${GPU_CHECK_ITERS:-30}; else BACKEND=nccl DEV=cuda ITERS=${GPU_CHECK_ITERS:-300}; fi
if [ "$ALLOW_CPU" = 1 ]; then BUDGET=${GPU_CHECK_BUDGET_S:-1500}; else BUDGET=${GPU_CHECK_BUDGET_S:-450}; fi
WINDOW=$((ITERS / 3)); [ "$WINDOW" -ge 1 ] || WINDOW=1
RESUME_TO=$((ITERS + 20))
OFFLOAD_ITERS=30
export WANDB_MODE=disabled FASTGEN_NO_PROGRESS=1
export GPU_CHECK_ALLOW_CPU=$ALLOW_CPU
START=$SECONDS
fail=0
declare -a SUMMARY=()   # "| item | value |" rows
declare -a STAGE_TIMES=()
fsdp_rate="" amp_rate="" offload_rate="" hand_plain="" hand_extra=""

ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fail=1; SUMMARY+=("| FAIL | $* |"); }
check() {  # check DESCRIPTION command...: ok / FAIL line
  local what=$1; shift
  if "$@"; then ok "$what"; else bad "$what"; fi
}
in_log() { grep -qE -- "$2" "$1"; }
# stage NAME LIMIT_S LOG command...: run under timeout (capped by what is left of the budget), show progress lines,
# keep the whole output in LOG; sets RC (124/137: timed out). Returns 1, after one FAIL line, when the budget left
# is under 20 s and the stage is not run.
stage() {
  local name=$1 limit=$2 log=$3; shift 3
  local left=$((BUDGET - (SECONDS - START)))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 20 ]; then
    : >"$log"; RC=125; bad "$name stage not run: the ${BUDGET}s budget is spent"; return 1
  fi
  echo "== $name (timeout ${limit}s)"
  local t0=$SECONDS
  : >"$log"
  timeout -k 15 "$limit" "$@" </dev/null >"$log" 2>&1 &
  local pid=$!
  tail -n +1 -f --pid="$pid" "$log" 2>/dev/null | grep -E --line-buffered "^(ok|FAIL|skip):|iteration [0-9]+/[0-9]+|resumed from|hand loop|Error|error:|Traceback" || true
  wait "$pid"; RC=$?
  STAGE_TIMES+=("$name $((SECONDS - t0))s")
  if [ "$RC" = 124 ] || [ "$RC" = 137 ]; then echo "   ($name timed out after ${limit}s)"; fi
}
rate_of() {  # rate_of LOG ITER: the it/s of the trainer's log line at iteration ITER/ITER
  grep -oE "iteration $2/$2 +loss [0-9.]+ +[0-9.]+ it/s" "$1" | grep -oE "[0-9.]+ it/s" | grep -oE "^[0-9.]+" | tail -1
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.3f", a / b; else print "n/a" }'; }

# ---- 0. the machine ------------------------------------------------------------------------------------------------
ENV_LINE=$("$PY" - <<'PYCHECK'
import os
import torch
if os.environ.get("GPU_CHECK_ALLOW_CPU") == "1":
    print(f"torch {torch.__version__}, CPU self-test (GPU_CHECK_ALLOW_CPU=1): gloo and CPU, figures meaningless")
else:
    assert torch.cuda.is_available(), "no CUDA GPU visible (GPU_CHECK_ALLOW_CPU=1 runs the CPU self-test)"
    assert torch.distributed.is_nccl_available(), "this torch has no NCCL"
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, "
          f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}")
PYCHECK
) || { echo "FAIL: ${ENV_LINE:-the environment check failed}"; exit 1; }
echo "$ENV_LINE"
work=$(mktemp -d)
if [ "${GPU_CHECK_KEEP:-0}" = 1 ]; then echo "logs kept in $work"; else trap 'rm -rf "$work"' EXIT; fi
export FASTGEN_OUTPUT_ROOT="$work/out"
TRAIN=(-m fastgen train -c Digits/config_sft_digits --log_level DEBUG -)
FSDP=(trainer.fsdp=True trainer.fsdp_param_dtype=bfloat16 trainer.fsdp_reduce_dtype=float32
      trainer.validation_iter=null)
ckpt() { printf "%s/fastgen/digits/%s/checkpoints/%07d" "$FASTGEN_OUTPUT_ROOT" "$1" "$2"; }

# ---- 1. in-process probes ------------------------------------------------------------------------------------------
probe_oks=0
if stage probe 180 "$work/probe.log" "$TORCHRUN" --standalone --nproc-per-node 1 benchmarks/gpu_probe.py; then
  probe_fails=$(grep -c "^FAIL:" "$work/probe.log")
  probe_oks=$(grep -c "^ok:" "$work/probe.log")
  while IFS= read -r line; do SUMMARY+=("| FAIL | ${line#FAIL: } |"); done < <(grep "^FAIL:" "$work/probe.log")
  [ "$probe_fails" -gt 0 ] && fail=1
  if [ "$RC" != 0 ] && [ "$probe_fails" = 0 ]; then
    bad "the probe stage exited with status $RC"
    tail -5 "$work/probe.log"
  fi
fi

# ---- 2. FSDP2 bf16 training with an async sharded save -------------------------------------------------------------
marker=$(ckpt gpu_check "$ITERS")
if stage fsdp 240 "$work/fsdp.log" "$TORCHRUN" --standalone --nproc-per-node 1 "${TRAIN[@]}" "${FSDP[@]}" \
    trainer.max_iter="$ITERS" trainer.logging_iter="$WINDOW" trainer.save_ckpt_iter="$ITERS" \
    trainer.checkpointer.async_save=True log_config.name=gpu_check; then
  L=$work/fsdp.log
  check "$BACKEND process group at world size 1" in_log "$L" "rank 0 of 1 joined the process group \($BACKEND"
  check "networks sharded with FSDP2" in_log "$L" "sharded net with FSDP2"
  check "the network is on $DEV, float32 master weights" in_log "$L" "module net: .*DiffusionNet, .*, $DEV(:[0-9]+)?, torch\.float32"
  fsdp_rate=$(rate_of "$L" "$ITERS")
  [ -n "$fsdp_rate" ] && ok "FSDP2 bf16 run finished: $fsdp_rate steps/s (iterations $((ITERS - WINDOW + 1))-$ITERS)" \
    || bad "the FSDP2 run did not finish (exit $RC)"
  check "async save logged at iteration $ITERS" in_log "$L" "INFO saving checkpoint .*/$(basename "$marker")\.pth"
  check "async sharded checkpoint complete (marker + DCP folder with .metadata)" \
    test -f "$marker.pth" -a -f "$marker.dcp/.metadata"
  [ "$RC" = 0 ] || { bad "the FSDP2 run exited with status $RC"; tail -5 "$L"; }
fi

# ---- 3. resume from the async checkpoint ---------------------------------------------------------------------------
if stage resume 150 "$work/resume.log" "$TORCHRUN" --standalone --nproc-per-node 1 "${TRAIN[@]}" "${FSDP[@]}" \
    trainer.max_iter="$RESUME_TO" trainer.logging_iter="$WINDOW" trainer.save_ckpt_iter="$ITERS" \
    trainer.checkpointer.async_save=True log_config.name=gpu_check; then
  L=$work/resume.log
  check "resumed from the async sharded checkpoint" in_log "$L" "INFO resumed from .*/$(basename "$marker")\.pth \(iteration $ITERS\)"
  check "resumed run trained to $RESUME_TO" in_log "$L" "iteration $RESUME_TO/$RESUME_TO +loss [0-9.]+ "
  check "resumed run saved its checkpoint" test -f "$(ckpt gpu_check "$RESUME_TO").pth" -a -f "$(ckpt gpu_check "$RESUME_TO").dcp/.metadata"
  [ "$RC" = 0 ] || { bad "the resumed run exited with status $RC"; tail -5 "$L"; }
fi

# ---- 4. FSDP CPU offload -------------------------------------------------------------------------------------------
if [ "$ALLOW_CPU" = 1 ]; then
  echo "skip: FSDP CPU offload run (needs CUDA; CPU self-test)"
elif stage offload 150 "$work/offload.log" "$TORCHRUN" --standalone --nproc-per-node 1 "${TRAIN[@]}" "${FSDP[@]}" \
    trainer.fsdp_cpu_offload=True trainer.max_iter=$OFFLOAD_ITERS trainer.logging_iter=10 \
    trainer.save_ckpt_iter=$OFFLOAD_ITERS log_config.name=gpu_check_offload; then
  L=$work/offload.log
  check "CPU offload: the sharded parameters live on the CPU" in_log "$L" "module net: .*DiffusionNet, .*, cpu, torch\.float32"
  offload_rate=$(rate_of "$L" "$OFFLOAD_ITERS")
  [ -n "$offload_rate" ] && ok "CPU offload run trained $OFFLOAD_ITERS iterations ($offload_rate steps/s, iterations 21-30)" \
    || bad "the CPU offload run did not finish with a finite loss (exit $RC)"
  [ "$RC" = 0 ] || { bad "the CPU offload run exited with status $RC"; tail -5 "$L"; }
fi

# ---- 5. one process, autocast bf16 (no torchrun, no FSDP) ----------------------------------------------------------
if stage amp 180 "$work/amp.log" "$PY" "${TRAIN[@]}" model.precision_amp=bfloat16 trainer.validation_iter=null \
    trainer.max_iter="$ITERS" trainer.logging_iter="$WINDOW" trainer.save_ckpt_iter="$ITERS" log_config.name=gpu_check_amp; then
  L=$work/amp.log
  check "one-process run: the network on $DEV" in_log "$L" "module net: DiffusionNet, .*, $DEV(:[0-9]+)?, torch\.float32"
  amp_rate=$(rate_of "$L" "$ITERS")
  [ -n "$amp_rate" ] && ok "one-process autocast bf16 run finished: $amp_rate steps/s" \
    || { bad "the one-process run did not finish (exit $RC)"; tail -5 "$L"; }
fi

# ---- 6. the hand-written loop --------------------------------------------------------------------------------------
if stage hand 120 "$work/hand.log" "$PY" benchmarks/gpu_handloop.py --device "$DEV" --iters "$ITERS" --window "$WINDOW"; then
  hand_plain=$(grep -oE "^hand loop plain: [0-9.]+" "$work/hand.log" | grep -oE "[0-9.]+$")
  hand_extra=$(grep -oE "^hand loop clip_ema: [0-9.]+" "$work/hand.log" | grep -oE "[0-9.]+$")
  [ -n "$hand_plain" ] && [ -n "$hand_extra" ] && ok "hand loop: $hand_plain steps/s plain, $hand_extra with clipping + EMA" \
    || { bad "the hand loop did not finish (exit $RC)"; tail -5 "$work/hand.log"; }
fi

# ---- summary -------------------------------------------------------------------------------------------------------
echo
echo "== summary ($ENV_LINE; digits SFT, batch 64, steps/s over iterations $((ITERS - WINDOW + 1))-$ITERS)"
echo "| item | value |"
echo "|---|---|"
echo "| machine | $ENV_LINE |"
echo "| in-process probes ok | $probe_oks (collective device, bound device, mixed precision, pinned staging, CPU offload) |"
echo "| fastgen FSDP2 bf16, torchrun 1 rank (steps/s) | ${fsdp_rate:-n/a} |"
echo "| fastgen 1 process, autocast bf16 (steps/s) | ${amp_rate:-n/a} |"
[ "$ALLOW_CPU" = 1 ] || echo "| fastgen FSDP2 bf16 + CPU offload (steps/s, iterations 21-30) | ${offload_rate:-n/a} |"
echo "| hand loop, autocast bf16 (steps/s) | ${hand_plain:-n/a} |"
echo "| hand loop + grad clip + EMA (steps/s) | ${hand_extra:-n/a} |"
echo "| ratio fastgen FSDP2 / hand loop | $(ratio "${fsdp_rate:-0}" "${hand_plain:-0}") |"
echo "| ratio fastgen 1 process / hand loop | $(ratio "${amp_rate:-0}" "${hand_plain:-0}") |"
echo "| ratio fastgen 1 process / hand loop + clip + EMA | $(ratio "${amp_rate:-0}" "${hand_extra:-0}") |"
echo "| async sharded save + resume | $(grep -q "INFO resumed from" "$work/resume.log" 2>/dev/null && echo "ok ($ITERS -> $RESUME_TO)" || echo FAIL) |"
echo "| stage wall times | ${STAGE_TIMES[*]-} |"
echo "| total wall time | $((SECONDS - START)) s |"
for row in ${SUMMARY[@]+"${SUMMARY[@]}"}; do echo "$row"; done
if [ "$fail" = 0 ]; then echo "all checks passed"; else echo "SOME CHECKS FAILED"; fi
exit $fail

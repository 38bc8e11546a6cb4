#!/usr/bin/env bash
# Device check: pages/s and peak memory of layout + MiniCPM-OCR + Jev per CUDA device at two
# batch sizes. Where CUDA or the real weights are missing it says so and exits 0. Bounded to
# 8 minutes in all (each device gets an equal share).
#   OCRFLEET_MINICPM_MODEL_PATH=... OCRFLEET_JEV_MODEL_PATH=... bash bench/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
BUDGET_S=${GPU_CHECK_BUDGET_S:-470}

devices=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null || echo 0)
if [ "${devices:-0}" = "0" ]; then
  echo "gpu_check: no CUDA device visible to torch here; nothing to measure"
  exit 0
fi
for var in OCRFLEET_MINICPM_MODEL_PATH OCRFLEET_JEV_MODEL_PATH; do
  if [ -z "${!var:-}" ] || [ ! -f "${!var}/config.json" ]; then
    echo "gpu_check: $var does not name a checkpoint folder (${!var:-unset}); nothing to measure"
    exit 0
  fi
done
per_device=$(( BUDGET_S / devices ))
echo "gpu_check: $devices device(s), ${per_device}s each"
status=0
for ((d = 0; d < devices; d++)); do
  CUDA_VISIBLE_DEVICES=$d timeout "$per_device" "$PY" bench/gpu_pages.py \
    --pages "${GPU_CHECK_PAGES:-8}" --batch-sizes "${GPU_CHECK_BATCH_SIZES:-4,16}"
  rc=$?
  if [ $rc -eq 124 ]; then echo "gpu_check: device $d ran out of its ${per_device}s share"; fi
  if [ $rc -ne 0 ]; then status=$rc; fi
done
exit $status

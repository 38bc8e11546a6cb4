#!/usr/bin/env bash
# Set up everything ocrfleet needs on a fresh Debian machine: system packages (tesseract,
# the CJK font the renderer uses), a virtualenv in .venv, and the package with its extras.
#   EXTRAS=dev,models,tesseract bash scripts/bootstrap.sh
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${EXTRAS:-tesseract}"

need_apt=()
command -v tesseract >/dev/null 2>&1 || need_apt+=(tesseract-ocr tesseract-ocr-eng tesseract-ocr-chi-sim)
[ -f /usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc ] || need_apt+=(fonts-noto-cjk)
# The font the synthetic test pages and examples are drawn in, and pdftotext for the PDF tests.
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need_apt+=(fonts-dejavu-core)
command -v pdftotext >/dev/null 2>&1 || need_apt+=(poppler-utils)
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[${EXTRAS}]"

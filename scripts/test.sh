#!/usr/bin/env bash
# The whole test suite on a fresh machine: services, virtualenv, package with test extras,
# lint, migration drift check, pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/services.sh
# The review app's browser tests drive Debian's chromium (Playwright's own browsers are
# never downloaded).
if [ ! -x /usr/bin/chromium ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium
fi
EXTRAS=dev,models,tesseract bash scripts/bootstrap.sh
export OMP_THREAD_LIMIT=1
.venv/bin/ruff check ocrfleet tests bench
# Models and migrations must not drift (alembic check) on SQLite and PostgreSQL.
check_db="sqlite:///$(mktemp -d)/check.db"
OCRFLEET_DATABASE_URL="$check_db" .venv/bin/ocrfleet db upgrade >/dev/null
OCRFLEET_DATABASE_URL="$check_db" .venv/bin/ocrfleet db check
# The slowest tests are printed, so the suite can be kept inside its time budget.
.venv/bin/python -m pytest --durations=30 "$@"

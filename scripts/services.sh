#!/usr/bin/env bash
# Start Redis and PostgreSQL on 127.0.0.1 when they are not answering (installing them with
# apt when absent). The tests use the real services, never fakes.
set -euo pipefail
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"

if ! (command -v redis-cli >/dev/null && redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG); then
  if ! command -v redis-server >/dev/null; then
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server
  fi
  $SUDO mkdir -p /var/lib/redis /var/log/redis
  $SUDO redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" \
    --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log
fi

if ! (command -v pg_isready >/dev/null && pg_isready -q -h 127.0.0.1 -p 5432); then
  if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql
    ver=$(ls /etc/postgresql | head -1)
    # Trust auth on loopback, as the test fixtures expect.
    $SUDO sed -i -E 's/^(host\s+all\s+all\s+(127.0.0.1\/32|::1\/128)\s+)\S+/\1trust/; s/^(local\s+all\s+(all|postgres)\s+)\S+/\1trust/' "/etc/postgresql/$ver/main/pg_hba.conf"
  fi
  $SUDO pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
fi

for _ in $(seq 1 60); do
  redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG && pg_isready -q -h 127.0.0.1 -p 5432 && exit 0
  sleep 1
done
echo "services did not come up: redis $(redis-cli -h 127.0.0.1 ping 2>&1), postgres $(pg_isready -h 127.0.0.1 2>&1)" >&2
exit 1

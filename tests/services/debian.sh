#!/usr/bin/env bash
# Installs the Debian packages the service-backed tests need, when they are missing:
# redis-server, haproxy, postgresql and chromium (the real peers that the replica, store,
# load-balancer and report tests run against). Idempotent; a machine that has them all
# installs nothing. It runs `apt-get update` then `apt-get install` of what is
# missing, so it needs root or sudo; without either, it says what is
# missing and fails, because a test that cannot run its peer is a failed test.
#
# Usage: bash tests/services/debian.sh            (all of them)
#        bash tests/services/debian.sh redis-server haproxy
set -euo pipefail

wanted=("$@")
[ ${#wanted[@]} -gt 0 ] || wanted=(redis-server haproxy postgresql chromium)

present() {
  case "$1" in
    redis-server) command -v redis-server >/dev/null ;;
    haproxy) command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] ;;
    postgresql) compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null ;;
    chromium) [ -x /usr/bin/chromium ] ;;
    *) dpkg -s "$1" >/dev/null 2>&1 ;;
  esac
}

missing=()
for p in "${wanted[@]}"; do
  present "$p" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
  apt=(apt-get)
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  apt=(sudo apt-get)
else
  echo "services: missing Debian packages ${missing[*]} and no root or sudo to install them" >&2
  exit 1
fi
echo "services: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${apt[@]}" update -qq >&2
"${apt[@]}" install -y -qq --no-install-recommends "${missing[@]}" >&2
# The Debian packages start their own daemons where systemd or init scripts run; the
# tests start private instances on free loopback ports, so stop the system ones.
for svc in redis-server haproxy postgresql; do
  if command -v service >/dev/null && service --status-all 2>/dev/null | grep -q " $svc\$"; then
    service "$svc" stop >/dev/null 2>&1 || true
  fi
done
for p in "${missing[@]}"; do
  present "$p" || { echo "services: $p still missing after apt-get install" >&2; exit 1; }
done

#!/usr/bin/env bash
# Bring harombe up on a Debian/Ubuntu machine, then run the main job (the demo).
#   scripts/setup.sh            everything, then `python -m harombe demo`
#   scripts/setup.sh --no-demo  everything but the demo (used by scripts/test.sh)
# Idempotent: a second run checks each step and takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV="${HAROMBE_VENV:-$ROOT/.venv}"
RUN_DEMO=1
[ "${1:-}" = "--no-demo" ] && RUN_DEMO=0

step() { printf '\033[1m==> %s\033[0m\n' "$*"; }
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

step "system packages (docker.io, runsc, debootstrap, cc, npm, chromium, tmux)"
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v runsc >/dev/null || missing+=(runsc)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v cc >/dev/null || missing+=(gcc libc6-dev)
command -v npm >/dev/null || missing+=(npm)
command -v chromium >/dev/null || missing+=(chromium)  # the approvals page's browser tests
command -v tmux >/dev/null || missing+=(tmux)  # `harombe shell`'s terminal tests
python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
else
  echo "all present"
fi

step "registering gVisor runtimes with Docker (runsc, runsc-net)"
changed=$($SUDO python3 scripts/docker_runtimes.py "$(command -v runsc)")
echo "daemon.json: $changed"

step "host limits for many sandboxes"
# Each idle gVisor sandbox holds ~57 host threads (sentry, gofer, shim); the kernel's default
# pid_max of 32768 runs out near 550 sandboxes. Raise it when it is lower (best effort).
if [ "$(cat /proc/sys/kernel/pid_max)" -lt 4194304 ]; then
  $SUDO sysctl -q -w kernel.pid_max=4194304 || echo "could not raise kernel.pid_max (fine for a few hundred sandboxes)"
fi
echo "kernel.pid_max=$(cat /proc/sys/kernel/pid_max)"

step "starting dockerd"
if ! $SUDO docker info >/dev/null 2>&1; then
  if [ -d /run/systemd/system ]; then
    $SUDO systemctl start docker
  else
    $SUDO sh -c 'nohup dockerd >/var/log/harombe-dockerd.log 2>&1 &'
  fi
  for _ in $(seq 1 60); do $SUDO docker info >/dev/null 2>&1 && break; sleep 0.5; done
elif [ "$changed" = "updated" ]; then
  $SUDO pkill -HUP -x dockerd || true  # dockerd reloads its runtimes on SIGHUP
  sleep 1
fi
$SUDO docker info --format '{{json .Runtimes}}' | grep -q '"runsc"' \
  || { echo "dockerd is up but runsc is not registered; see /etc/docker/daemon.json" >&2; exit 1; }
echo "dockerd is up with runsc"

step "python environment ($VENV)"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
stamp="$VENV/.harombe-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  "$VENV/bin/pip" install --disable-pip-version-check -q -e ".[dev]"
  touch "$stamp"
  echo "installed harombe and its dependencies"
else
  echo "up to date"
fi

step "sandbox image"
$SUDO "$VENV/bin/python" -m harombe images build

if [ "$RUN_DEMO" -eq 1 ]; then
  step "demo: Python, JavaScript and shell in gVisor"
  "$VENV/bin/python" -m harombe demo
fi

#!/usr/bin/env bash
# Make the Docker engine answer, make sure a compose CLI is there, and build Loom's sandbox
# image, idempotently: a second run finds everything in place and takes a second or two.
#
# Where no registry is reachable (CI, air-gapped hosts) the base image is a Debian rootfs made
# with debootstrap and imported into Docker (it also serves docker/compose.offline.yml). With a
# registry, set LOOM_BASE_IMAGE (for example python:3.11-slim) and it is pulled instead.
#
# Without CI=true a host with no usable Docker only gets a warning (the docker backend's tests
# then skip); with CI=true it is an error.
set -euo pipefail
cd "$(dirname "$0")"

BASE_IMAGE=${LOOM_BASE_IMAGE:-loom-base:bookworm}
SANDBOX_IMAGE=${LOOM_SANDBOX_DOCKER_IMAGE:-loom-sandbox:latest}
DEBIAN_MIRROR=${LOOM_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# Bumped when the debootstrap recipe changes, so an older local base is rebuilt.
BASE_RECIPE=2
in_ci() { [[ "${CI:-}" =~ ^(1|true|yes)$ ]]; }
say() { echo "docker/ensure-images.sh: $*" >&2; }
daemon_answers() { docker info >/dev/null 2>&1; }

give_up() {
  if in_ci; then say "ERROR: $*"; exit 1; fi
  say "warning: $* (the docker sandbox backend's tests will skip)"; exit 0
}

start_daemon() {
  [[ $(id -u) == 0 ]] || give_up "the Docker daemon does not answer and this user cannot start it"
  if ! command -v dockerd >/dev/null; then
    command -v apt-get >/dev/null || give_up "no dockerd and no apt-get to install docker.io"
    say "installing docker.io"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io >/dev/null
  fi
  say "starting dockerd (log: /var/log/loom-dockerd.log)"
  nohup dockerd >/var/log/loom-dockerd.log 2>&1 &
  for _ in $(seq 60); do daemon_answers && return; sleep 0.5; done
  give_up "dockerd did not come up; see /var/log/loom-dockerd.log"
}

build_base_from_debootstrap() {
  if ! command -v debootstrap >/dev/null; then
    [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null || give_up "debootstrap is missing"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null
  fi
  local rootfs
  rootfs=$(mktemp -d /tmp/loom-rootfs.XXXXXX)
  trap 'rm -rf "$rootfs"' RETURN
  say "building $BASE_IMAGE with debootstrap (about a minute)"
  # python3-venv and ca-certificates: the Loom images make a virtualenv and pip uses HTTPS.
  debootstrap --variant=minbase --include=python3-minimal,python3,python3-venv,ca-certificates \
    bookworm "$rootfs" "$DEBIAN_MIRROR" >/dev/null
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | docker import --change 'CMD ["/bin/bash"]' \
    --change "LABEL loom.base-recipe=$BASE_RECIPE" - "$BASE_IMAGE" >/dev/null
}

local_base_is_current() {
  [[ $(docker image inspect --format '{{ index .Config.Labels "loom.base-recipe" }}' \
    "$BASE_IMAGE" 2>/dev/null) == "$BASE_RECIPE" ]]
}

# Compose v2 (`docker compose`) where the Docker CLI has it, else Debian's docker-compose.
ensure_compose() {
  docker compose version >/dev/null 2>&1 && return
  command -v docker-compose >/dev/null && return
  [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null || give_up "no docker compose CLI"
  say "installing docker-compose"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker-compose >/dev/null
}

daemon_answers || start_daemon
ensure_compose
if [[ -n "${LOOM_BASE_IMAGE:-}" ]]; then
  docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 || docker pull "$BASE_IMAGE" \
    || give_up "cannot pull $BASE_IMAGE"
elif ! local_base_is_current; then
  build_base_from_debootstrap
fi
if ! log=$(docker build --build-arg "BASE_IMAGE=$BASE_IMAGE" -t "$SANDBOX_IMAGE" sandbox 2>&1); then
  echo "$log" >&2
  give_up "building $SANDBOX_IMAGE failed"
fi
say "ready: $SANDBOX_IMAGE (from $BASE_IMAGE)"

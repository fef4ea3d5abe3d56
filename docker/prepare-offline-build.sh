#!/usr/bin/env bash
# Fill docker/wheels/ and docker/certs/ for building the Loom images where PyTorch's index is
# unreachable or a TLS-inspecting proxy sits in front of PyPI (docker/compose.offline.yml):
#   - torch's CPU build, as this host's pip finds it (its find-links or index);
#   - this host's extra CA certificates (/usr/local/share/ca-certificates).
# Idempotent; run from anywhere.
set -euo pipefail
shopt -s nullglob
cd "$(dirname "$0")"
PIP=${PIP:-../.venv/bin/pip}
TORCH=${LOOM_TORCH_REQUIREMENT:-torch==2.13.0+cpu}
compgen -G "wheels/torch-*.whl" >/dev/null \
  || "$PIP" download --quiet --no-deps --dest wheels "$TORCH"
for cert in /usr/local/share/ca-certificates/*.crt; do
  cp -u "$cert" certs/
done
echo "docker/prepare-offline-build.sh: ready:" wheels/*.whl certs/*.crt >&2

#!/usr/bin/env bash
# The process sandbox backend runs each slot's agent under bubblewrap (services/sandbox/
# confinement.py) and refuses to start without it. Install Debian's `bubblewrap` when it is
# missing and we may (root with apt-get); otherwise say how and go on: the process backend's
# tests then fail with that same message, and a service does not start.
set -euo pipefail

if command -v bwrap >/dev/null 2>&1; then
    exit 0
fi
if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-bwrap: bwrap is missing and this is not root with apt-get; install" \
         "bubblewrap (e.g. sudo apt-get install bubblewrap) for the process sandbox" >&2
    exit 0
fi
echo "ensure-bwrap: installing bubblewrap (Debian package)" >&2
export DEBIAN_FRONTEND=noninteractive
if apt-get install -y -qq bubblewrap >/dev/null 2>&1 \
        || { apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; }; then
    bwrap --version >&2
else
    echo "ensure-bwrap: could not install bubblewrap" >&2
fi

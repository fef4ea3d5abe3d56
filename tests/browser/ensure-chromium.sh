#!/usr/bin/env bash
# The browser tests (tests/browser) drive Debian's chromium through Playwright; Playwright's
# own browser download is not used. Install chromium when it is missing and we may (root with
# apt-get); otherwise say so and go on: the tests then skip, or fail under CI=true.
set -euo pipefail

CHROMIUM=/usr/bin/chromium
if [[ -x "$CHROMIUM" ]]; then
    exit 0
fi
if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-chromium: $CHROMIUM is missing and this is not root with apt-get;" \
         "install Debian's chromium to run tests/browser" >&2
    exit 0
fi
echo "ensure-chromium: installing chromium (Debian package)" >&2
export DEBIAN_FRONTEND=noninteractive
# A failed install does not stop `make test`: the browser tests report the missing browser.
if apt-get update -qq && apt-get install -y -qq chromium >/dev/null; then
    "$CHROMIUM" --version >&2
else
    echo "ensure-chromium: could not install chromium" >&2
fi

#!/bin/bash
# First start: initdb with the official image's variables; then run the server in the foreground
# on PGPORT (default 5432) and LISTEN_ADDRESSES (default all).
set -euo pipefail
if [[ ! -s "$PGDATA/PG_VERSION" ]]; then
  initdb --encoding=UTF8 --locale=C.UTF-8 --username="${POSTGRES_USER:-postgres}" --pwfile=<(printf '%s' "$POSTGRES_PASSWORD") \
    --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  pg_ctl -o "-c listen_addresses=''" -w start >/dev/null
  createdb --username="${POSTGRES_USER:-postgres}" "${POSTGRES_DB:-${POSTGRES_USER:-postgres}}"
  pg_ctl -m fast -w stop >/dev/null
fi
exec postgres -c listen_addresses="${LISTEN_ADDRESSES:-*}" -c port="${PGPORT:-5432}"

#!/bin/sh
# The official image's start-up, in short: a new data directory gets its cluster, user and
# database; then the server runs in this process as user postgres (it gets the signals).
set -eu
# The server's programs, of whichever version Debian's package installed.
PATH=$(find /usr/lib/postgresql -maxdepth 2 -name bin -type d | sort | tail -n 1):$PATH
: "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}"
: "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required}"
mkdir -p "$PGDATA" /run/postgresql
chown -R postgres:postgres "$PGDATA" /run/postgresql
chmod 700 "$PGDATA"
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    password=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" > "$password"
    chown postgres "$password"
    as_postgres initdb --username="$POSTGRES_USER" --pwfile="$password" \
        --encoding=UTF8 --locale=C.UTF-8 --auth-local=trust --auth-host=scram-sha-256 >/dev/null
    rm -f "$password"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    as_postgres pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    if [ "$POSTGRES_DB" != "postgres" ]; then
        as_postgres psql -q -U "$POSTGRES_USER" -d postgres -c "CREATE DATABASE \"$POSTGRES_DB\""
    fi
    as_postgres pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups \
    postgres -D "$PGDATA" -c listen_addresses='*'

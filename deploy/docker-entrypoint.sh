#!/bin/sh
# `serve` (the default): migrate the database, then run the service in this process (PID 1 gets
# the signals). Anything else is a twinwatch command, e.g. `twin --url http://app:8000 ...`.
set -eu
if [ "$#" -eq 0 ] || [ "$1" = "serve" ]; then
    [ "$#" -gt 0 ] && shift
    twinwatch db upgrade
    exec twinwatch serve "$@"
fi
exec twinwatch "$@"

#!/usr/bin/env bash
# The image and the compose stack, built and run for real: what CI does (.ci/run calls this),
# and what anyone can do as root on a Debian 12 (bookworm) machine that reaches Debian's mirror
# and the package index, even with no container registry in reach.
#
#   deploy/container-check.sh        (from a checkout with `make venv` done: the stack's test
#                                      runs under .venv's pytest; PYTHON=... to use another)
#
# 1. installs podman (runc, cgroupfs, file events: containers.conf below) and podman-compose
#    from Debian's packages; nothing is skipped: if they cannot be installed, this fails;
# 2. makes the base images the Dockerfiles name (python:3.11-slim, debian:bookworm-slim) with
#    debootstrap, a minimal Debian 12 with its Python 3.11, cached as a tar in
#    $TWINWATCH_CI_CACHE (default /var/cache/twinwatch-ci) for the next run;
# 3. builds the image from the Dockerfile (in Docker's format: an OCI image drops HEALTHCHECK),
#    prints its size in MB on a line of its own (and fails above 350 MB) and its largest layers;
# 4. runs it: /healthz, /readyz, its own health check, a non-root user, a stream PUT and
#    readings POSTed, /metrics; SIGTERM stops it within 10 s with a checkpoint written, and
#    started again on the same volume the stream continues where it was;
# 5. builds PostgreSQL's, Prometheus's and NATS's images from Debian's packages (deploy/ci/)
#    and runs the compose stack's end-to-end test (tests/containers/), as docker-compose.yml
#    runs it and scaled out on the bus (docker-compose.bus.yml).
#
# Everything it makes lives in one temporary directory (its own image store, removed at the
# end); no system configuration file is changed.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
PYTHON=${PYTHON:-.venv/bin/python}
CACHE=${TWINWATCH_CI_CACHE:-/var/cache/twinwatch-ci}
IMAGE=localhost/twinwatch:latest
MAX_MB=350
STACK=twinwatch-stack-check  # the compose project of tests/containers/
WORK=$(mktemp -d /var/tmp/twinwatch-containers.XXXXXX)
CONTAINER="" VOLUME=""

step() { printf '\n== %s (at %d s)\n' "$*" $(( $(date +%s) - started )); }
fail() { echo "container check FAILED: $*" >&2; exit 1; }

# The engine's configuration for this run only, before anything can run podman: its own image
# store and network definitions in $WORK (no system file is read or changed). runc and
# cgroupfs: crun refuses these machines' mixed cgroup setup, and there is no systemd. Root here
# cannot raise limits beyond these.
cat > "$WORK/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[network]
network_config_dir = "$WORK/networks"
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
cat > "$WORK/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$WORK/storage"
runroot = "$WORK/run"
EOF
mkdir -p "$WORK/networks"
export CONTAINERS_CONF=$WORK/containers.conf CONTAINERS_STORAGE_CONF=$WORK/storage.conf

cleanup() {
  set +e
  if command -v podman >/dev/null; then
    # Everything in this store is this run's: its containers, volumes, network, images.
    podman rm --all --force --time 5 >/dev/null 2>&1
    podman volume prune --force >/dev/null 2>&1
    podman network rm --force "${STACK}_default" >/dev/null 2>&1
    podman rmi --all --force >/dev/null 2>&1
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

step "the container engine (Debian's podman, runc, podman-compose)"
packages=(podman buildah runc debootstrap podman-compose
          golang-github-containernetworking-plugin-dnsname curl)
missing=()
for package in "${packages[@]}"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || fail "apt-get update failed"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || fail "could not install ${missing[*]}"
fi
podman --version

step "the base images (debootstrap, Debian 12 with Python 3.11)"
debian_mirror() {  # the one apt uses (deb822 or one-line sources), else Debian's own
  local found=${DEBIAN_MIRROR:-}
  if [ -z "$found" ] && [ -r /etc/apt/sources.list.d/debian.sources ]; then
    found=$(sed -n 's/^URIs: *\([^ ]*debian\)$/\1/p;T;q' /etc/apt/sources.list.d/debian.sources)
  fi
  if [ -z "$found" ] && [ -r /etc/apt/sources.list ]; then
    found=$(sed -n 's/^deb \(http[^ ]*debian\) bookworm .*/\1/p;T;q' /etc/apt/sources.list)
  fi
  echo "${found:-http://deb.debian.org/debian}"
}
# Made again each week, so the base has the week's security updates.
base=$CACHE/debian-bookworm-python3.11-$(date +%G-w%V).tar
if [ -s "$base" ]; then
  podman load --quiet --input "$base"
else
  mirror=$(debian_mirror)
  debootstrap --variant=minbase --include=python3,python3-venv,python-is-python3,ca-certificates \
    bookworm "$WORK/rootfs" "$mirror" >"$WORK/debootstrap.log" 2>&1 \
    || { tail -n 20 "$WORK/debootstrap.log"; fail "debootstrap failed"; }
  # What no container needs: package lists and caches, documentation, translations, the
  # character-set converters (Python has its own), the standard library's bytecode.
  rm -rf "$WORK"/rootfs/var/cache/apt/* "$WORK"/rootfs/var/lib/apt/lists/* \
    "$WORK"/rootfs/usr/share/doc/* "$WORK"/rootfs/usr/share/man/* \
    "$WORK"/rootfs/usr/share/info/* "$WORK"/rootfs/usr/share/locale/* \
    "$WORK"/rootfs/usr/lib/x86_64-linux-gnu/gconv
  find "$WORK"/rootfs/usr/lib/python3* -depth -type d -name __pycache__ -exec rm -rf {} +
  tar -C "$WORK/rootfs" -c . | podman import --quiet - localhost/debian-bookworm-python3.11 >/dev/null
  rm -rf "$WORK/rootfs"
  mkdir -p "$CACHE"
  rm -f "$CACHE"/debian-bookworm-python3.11-*.tar
  podman save --quiet --output "$base.partial" localhost/debian-bookworm-python3.11 \
    && mv "$base.partial" "$base"
fi
# The names the Dockerfiles' FROM lines use, so they stay the files users build elsewhere.
podman tag localhost/debian-bookworm-python3.11 docker.io/library/python:3.11-slim-bookworm
podman tag localhost/debian-bookworm-python3.11 docker.io/library/debian:bookworm-slim

step "the image, from the Dockerfile"
secret=()
# Behind a proxy that intercepts TLS, pip inside the build needs its CA: handed in as a build
# secret, in no layer of the image.
if [ -s /etc/ssl/certs/ca-certificates.crt ]; then
  secret=(--secret "id=ca-certificates,src=/etc/ssl/certs/ca-certificates.crt")
fi
podman build --pull=never --format docker --quiet "${secret[@]}" --tag "$IMAGE" . >/dev/null \
  || fail "the image did not build"
bytes=$(podman image inspect --format '{{.Size}}' "$IMAGE")
mb=$(( (bytes + 500000) / 1000000 ))
echo "image size: $mb MB"
echo "largest layers:"
podman history --format '{{.Size}}\t{{.CreatedBy}}' "$IMAGE" | sort -h -r | head -n 3 | cut -c 1-110
[ "$mb" -le "$MAX_MB" ] || fail "the image is $mb MB, more than $MAX_MB MB"

step "the image, run: health, readiness, a stream, readings, metrics"
port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url=http://127.0.0.1:$port
VOLUME=twinwatch-check-$$
podman volume create "$VOLUME" >/dev/null || fail "podman volume create"
# (no health-check timer: podman runs them with systemd, absent here; `healthcheck run` below)
CONTAINER=$(podman run --detach --health-interval disable --volume "$VOLUME:/var/lib/twinwatch" \
  --publish "127.0.0.1:$port:8000" "$IMAGE") || fail "the container did not start"
wait_ready() {
  for _ in $(seq 180); do
    curl -sf --max-time 2 "$url/readyz" >/dev/null && return 0
    sleep 0.5
  done
  podman logs --tail 30 "$CONTAINER"
  fail "/readyz did not answer 200 within 90 s"
}
wait_ready
curl -sf "$url/healthz" >/dev/null || fail "/healthz"
podman healthcheck run "$CONTAINER" || fail "the image's HEALTHCHECK"
[ "$(podman exec "$CONTAINER" id -u)" != 0 ] || fail "the service runs as root"
readings() {  # first, count: readings of a sine at 10 Hz, as JSON
  "$PYTHON" -c 'import json, math, sys
first, count = int(sys.argv[1]), int(sys.argv[2])
print(json.dumps({"readings": [{"t": 1.7e9 + 0.1 * i, "value": math.sin(i / 20)}
                               for i in range(first, first + count)]}))' "$1" "$2"
}
field() { "$PYTHON" -c "import json, sys; print(json.load(sys.stdin)$1)"; }
curl -sf -X PUT "$url/v1/streams/pump-1" -H 'Content-Type: application/json' \
  -d '{"model": "lstm-stateful-day-seed3"}' >/dev/null || fail "PUT /v1/streams/pump-1"
accepted=$(readings 0 1500 | curl -sf -X POST "$url/v1/streams/pump-1/readings?results=false" \
  -H 'Content-Type: application/json' --data-binary @- | field '["accepted"]') \
  || fail "POST /v1/streams/pump-1/readings"
[ "$accepted" = 1500 ] || fail "POST readings: $accepted accepted of 1500"
metrics=$(curl -sf --max-time 10 "$url/metrics") || fail "GET /metrics"
grep -q '^twinwatch_readings_accepted_total 1500' <<<"$metrics" \
  || fail "/metrics does not count the 1,500 readings"
echo "healthy, non-root, 1500 readings accepted and counted"

step "SIGTERM: a clean stop within 10 s, a checkpoint, and the stream continues after a restart"
stop_started=$(date +%s%N)
podman stop --time 10 "$CONTAINER" >/dev/null || fail "podman stop"
stop_ms=$(( ($(date +%s%N) - stop_started) / 1000000 ))
code=$(podman inspect --format '{{.State.ExitCode}}' "$CONTAINER") || fail "podman inspect"
echo "stopped in $stop_ms ms, exit code $code"
if [ "$code" != 0 ] || [ "$stop_ms" -ge 10000 ]; then
  fail "no clean stop on SIGTERM within 10 s"
fi
logs=$(podman logs "$CONTAINER" 2>&1) || fail "podman logs"
grep -q "Application shutdown complete" <<<"$logs" || fail "the service did not shut down"
checkpoint=$(podman run --rm --interactive --volume "$VOLUME:/var/lib/twinwatch" \
  --entrypoint python "$IMAGE" - <<'EOF'
import sqlite3
database = sqlite3.connect("/var/lib/twinwatch/twinwatch.db")
query = "SELECT sample_count FROM stream_checkpoints WHERE stream_id = 'pump-1'"
print(database.execute(query).fetchone()[0])
EOF
) || fail "the checkpoint could not be read from the volume"
[ "$checkpoint" = 1500 ] || fail "the checkpoint holds $checkpoint readings, not 1500"
podman start "$CONTAINER" >/dev/null || fail "podman start"
wait_ready
seen=$(curl -sf "$url/v1/streams/pump-1" | field '["samples_seen"]') \
  || fail "GET /v1/streams/pump-1 after the restart"
[ "$seen" = 1500 ] || fail "after the restart the stream has seen $seen readings, not 1500"
answer=$(readings 1400 600 | curl -sf -X POST "$url/v1/streams/pump-1/readings?results=false" \
  -H 'Content-Type: application/json' --data-binary @-) || fail "POST readings after the restart"
if [ "$(echo "$answer" | field '["duplicates"]')" != 100 ] \
  || [ "$(echo "$answer" | field '["accepted"]')" != 500 ]; then
  fail "after the restart: $answer (100 duplicates and 500 new readings expected)"
fi
echo "checkpoint at 1500 readings; after the restart 100 re-sent readings were duplicates and 500 new ones followed"
podman rm --force --time 5 "$CONTAINER" >/dev/null && CONTAINER=""
podman volume rm --force "$VOLUME" >/dev/null && VOLUME=""

step "the compose stack: PostgreSQL, Prometheus and NATS images from Debian's packages"
podman build --pull=never --quiet --tag localhost/twinwatch-ci-postgres:latest deploy/ci/postgres \
  >/dev/null || fail "the PostgreSQL image did not build"
podman build --pull=never --quiet --tag localhost/twinwatch-ci-prometheus:latest \
  deploy/ci/prometheus >/dev/null || fail "the Prometheus image did not build"
podman build --pull=never --quiet --tag localhost/twinwatch-ci-nats:latest deploy/ci/nats \
  >/dev/null || fail "the NATS image did not build"

step "the compose stack, end to end (tests/containers/)"
TWINWATCH_CONTAINER_STACK=1 "$PYTHON" -m pytest -q -p no:cacheprovider tests/containers \
  || fail "the compose stack's end-to-end test"

step "container check passed"

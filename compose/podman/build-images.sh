#!/usr/bin/env bash
# Build, under the names docker-compose.yml pins, the three images that no registry can give
# this machine, from Debian's packages of the same versions. Idempotent: an image that exists
# is kept. Needs root, podman, debootstrap and busybox-static (compose/podman/README.md), and
# the binaries `make binaries` fetches (prometheus/fetch-binaries.sh, into RUNWATCH_BIN).
#
#   prom/prometheus:v3.5.3           FROM scratch: Debian sid's prometheus 3.5.3 binary, libc, busybox
#   prom/alertmanager:v0.33.1        FROM scratch: Debian sid's alertmanager 0.33.1 binary, libc, busybox
#   python:3.11.11-slim-bookworm     a debootstrap'd bookworm with python3 (3.11.2) and pip
#
# Each keeps the upstream image's ENTRYPOINT, CMD, USER, WORKDIR and data directory, so the
# compose file runs unchanged. An image this version of the script did not build is rebuilt.
# Usage: build-images.sh [--force]
set -euo pipefail

PROMETHEUS_IMAGE=prom/prometheus:v3.5.3
ALERTMANAGER_IMAGE=prom/alertmanager:v0.33.1
BIN=${RUNWATCH_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/runwatch/bin}
PYTHON_IMAGE=python:3.11.11-slim-bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

force=0
[ "${1:-}" = "--force" ] && force=1

say() { echo "build-images: $*" >&2; }
# Each image is labelled with this script's hash: an image built by an older version of it
# (say, without Prometheus's web UI files) is rebuilt, not kept.
BUILD=$(sha256sum "$0" | cut -c1-16)
have() {
  [ "$force" = 0 ] && [ "$(podman image inspect --format '{{ index .Labels "runwatch.build" }}' "$1" 2>/dev/null)" = "$BUILD" ]
}

# The binaries must be of the versions the images are named after.
for pair in "prometheus ${PROMETHEUS_IMAGE##*:v}" "alertmanager ${ALERTMANAGER_IMAGE##*:v}"; do
  set -- $pair
  "$BIN/$1" --version 2>&1 | grep -q "version $2[+ ]" || {
    say "$BIN/$1 is not $1 $2 (run make binaries): cannot build its image"
    exit 1
  }
done

work=$(mktemp -d /var/tmp/runwatch-images.XXXXXX)
trap 'rm -rf "$work"' EXIT

# A root file system with one Debian binary, the C library it links and static busybox (for
# `sh` and the `wget` healthchecks), and a `nobody` user, as upstream's busybox-based images have.
scratch_root() {
  local root=$1 binary=$2 name=$3
  mkdir -p "$root"/{bin,etc,tmp,lib64,lib/x86_64-linux-gnu}
  chmod 1777 "$root/tmp"
  cp /bin/busybox "$root/bin/busybox"
  for applet in sh wget ls cat; do ln -s busybox "$root/bin/$applet"; done
  cp "$binary" "$root/bin/$name"
  cp -L /lib/x86_64-linux-gnu/libc.so.6 "$root/lib/x86_64-linux-gnu/"
  cp -L /lib64/ld-linux-x86-64.so.2 "$root/lib64/"
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n' >"$root/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\n' >"$root/etc/group"
  printf 'hosts: files dns\n' >"$root/etc/nsswitch.conf"
}

# The image itself, FROM scratch over ctx/rootfs, as upstream's: `nobody` owns /NAME, the data
# volume and working directory; the binary /bin/NAME is the entrypoint; CMD is upstream's.
build_scratch() {
  local image=$1 ctx=$2 name=$3 port=$4 cmd=$5
  mkdir -p "$ctx/data"
  printf '%s\n' "FROM scratch" "LABEL runwatch.build=$BUILD" "COPY rootfs/ /" "COPY --chown=65534:65534 data/ /$name/" "USER nobody" \
    "EXPOSE $port" "VOLUME [\"/$name\"]" "WORKDIR /$name" "ENTRYPOINT [\"/bin/$name\"]" "CMD $cmd" \
    >"$ctx/Containerfile"
  say "building $image"
  podman build -q -t "$image" "$ctx" >/dev/null
}

if have "$PROMETHEUS_IMAGE"; then
  say "$PROMETHEUS_IMAGE exists"
else
  ctx=$work/prometheus
  scratch_root "$ctx/rootfs" "$BIN/prometheus" prometheus
  cp "$BIN/promtool" "$ctx/rootfs/bin/promtool"
  mkdir -p "$ctx/rootfs/etc/prometheus" "$ctx/rootfs/usr/share/prometheus"
  printf 'global:\n  scrape_interval: 15s\n' >"$ctx/rootfs/etc/prometheus/prometheus.yml"
  # Debian's 3.x build reads its (UI-less) web assets from here: the page that says it has no UI.
  cp -r "$BIN/share/prometheus/web" "$ctx/rootfs/usr/share/prometheus/web"
  build_scratch "$PROMETHEUS_IMAGE" "$ctx" prometheus 9090 \
    '["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]'
fi

if have "$ALERTMANAGER_IMAGE"; then
  say "$ALERTMANAGER_IMAGE exists"
else
  ctx=$work/alertmanager
  scratch_root "$ctx/rootfs" "$BIN/alertmanager" alertmanager
  cp "$BIN/amtool" "$ctx/rootfs/bin/amtool"
  # Debian's build reads its notification templates from here.
  mkdir -p "$ctx/rootfs/usr/share/prometheus" "$ctx/rootfs/etc/alertmanager"
  cp -r "$BIN/share/prometheus/alertmanager" "$ctx/rootfs/usr/share/prometheus/"
  build_scratch "$ALERTMANAGER_IMAGE" "$ctx" alertmanager 9093 \
    '["--config.file=/etc/alertmanager/alertmanager.yml", "--storage.path=/alertmanager"]'
fi

if have "$PYTHON_IMAGE"; then
  say "$PYTHON_IMAGE exists"
else
  root=$work/python
  say "debootstrap of bookworm for $PYTHON_IMAGE (about a minute)"
  debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates \
    bookworm "$root" "$MIRROR" >"$work/debootstrap.log" 2>&1 || {
    tail -n 5 "$work/debootstrap.log" >&2
    exit 1
  }
  # The official image's pip installs into the system: no PEP 668 marker, python and pip on PATH.
  rm -f "$root"/usr/lib/python3*/EXTERNALLY-MANAGED
  ln -sf /usr/bin/python3 "$root/usr/local/bin/python"
  ln -sf /usr/bin/pip3 "$root/usr/local/bin/pip"
  # This machine reaches PyPI through a TLS proxy that only the host's CA bundle trusts.
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | podman import -q \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
    --change 'CMD ["python3"]' \
    --change "LABEL runwatch.build=$BUILD" \
    - "$PYTHON_IMAGE" >/dev/null
fi
say "images ready"

#!/usr/bin/env bash
# make test-fresh: README's commands on a bare Debian 12, as a newcomer's machine has them.
#
# A Debian 12 root from `debootstrap --variant=minbase` (cached between runs, keyed on how it is
# built), into which only this machine's certificate bundle, its pip and apt settings and a hosts
# file are copied, and a clone of this checkout's HEAD. Inside it (chroot, in a mount namespace
# and a network namespace of its own, with NAT to the outside for the package indexes), with the
# environment of a fresh root login (no PYTHONUNBUFFERED, no PIP_*: the settings are files), the
# commands in README's block between `<!-- fresh-machine -->` markers run exactly as printed:
#   1. the set-up lines (the clone is already there: this checkout's HEAD);
#   2. `make lab`, in the foreground as a learner runs it, until Prometheus, Alertmanager, the
#      pager, the console and the trainer each answer (and Prometheus has scraped the trainer);
#      then `runwatch down` from a second shell, and `make lab` must exit 0;
#   3. `make test`.
# Each step's wall time is printed; README's figures for its opening commands come from here.
# Anything the lab or the tests need that README's commands do not install fails here, as the
# Alertmanager template from a package this machine once had did (issue 35).
#
# Usage: tests/fresh-machine.sh [--drop TARGET:PREREQUISITE]... [--keep]
#   --drop lab:binaries   takes an install step out of the clone's Makefile first: the tier must
#                         then fail, naming what is missing (docs/fresh-machine.md shows a run)
#   --keep                leave the root in place afterwards, for a look inside
# Needs root, debootstrap, iptables, iproute2, git and util-linux (make test-fresh installs them).
set -euo pipefail

say() { echo "test-fresh: $*" >&2; }
tier_started=$(date +%s)
fail() { say "$*"; exit 1; }

REPO=$(cd "$(dirname "$0")/.." && pwd)
SUITE=bookworm
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/runwatch/fresh
LAB_READY_S=300   # make lab's own bound: each component's readiness wait (60 s) for five components
drops=()
keep=0
while [ $# -gt 0 ]; do
  case $1 in
    --drop) [ $# -ge 2 ] && [[ $2 == *:* ]] || fail "--drop: give TARGET:PREREQUISITE, as lab:binaries"
            drops+=("$2"); shift 2 ;;
    --keep) keep=1; shift ;;
    *) fail "unknown argument $1 (usage: tests/fresh-machine.sh [--drop TARGET:PREREQUISITE]... [--keep])" ;;
  esac
done
[ "$(id -u)" = 0 ] || fail "needs root: debootstrap, chroot, mounts and a network namespace"
for tool in debootstrap iptables ip git unshare chroot flock; do
  command -v "$tool" >/dev/null || fail "needs $tool (make test-fresh installs it)"
done

# README's block: the lines between <!-- fresh-machine --> and <!-- /fresh-machine -->, inside
# its ```sh fence, comments removed.
readme_commands() {
  awk '/<!-- fresh-machine -->/{on=1; next} /<!-- \/fresh-machine -->/{on=0} on' "$REPO/README.md" |
    grep -v '^```' | sed 's/[[:space:]]*#.*$//' | sed '/^[[:space:]]*$/d'
}
mapfile -t commands < <(readme_commands)
[ ${#commands[@]} -gt 0 ] || fail "README.md has no <!-- fresh-machine --> block of commands"
printf '%s\n' "${commands[@]}" | grep -qx 'make lab' || fail "README's fresh-machine block has no line 'make lab'"
printf '%s\n' "${commands[@]}" | grep -qx 'make test' || fail "README's fresh-machine block has no line 'make test'"

# The Debian archive as this machine's apt sources name it (as prometheus/fetch-binaries.sh reads it).
mirror=$(
  { grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}'
    grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | sed 's/\[[^]]*\]//' | awk '{print $2}'
  } | grep -m1 -E '/debian/?$' || true
)
[ -n "$mirror" ] || fail "no Debian archive in this machine's apt sources"

# One tier at a time on a machine: each turns on IPv4 forwarding for its NAT and puts back what
# it found, which would cut the other's network off mid-run.
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9

# --- the bare root, cached: debootstrap takes minutes, unpacking its tarball seconds ---
key=$(printf '%s\n' "$SUITE minbase $mirror" "$(debootstrap --version)" | sha256sum | cut -c1-16)
image=$CACHE/debian-$SUITE-minbase-$key.tar
if [ ! -s "$image" ]; then
  say "building a bare Debian $SUITE (debootstrap --variant=minbase, from $mirror) into $image"
  mkdir -p "$CACHE"
  build=$(mktemp -d /var/tmp/runwatch-debootstrap.XXXXXX)
  debootstrap --variant=minbase "$SUITE" "$build" "$mirror" >"$build.log" 2>&1 ||
    { tail -n 5 "$build.log" >&2; rm -rf "$build" "$build.log"; fail "debootstrap failed"; }
  tar -C "$build" -cf "$image.tmp" . && mv "$image.tmp" "$image"
  rm -rf "$build" "$build.log"
fi

work=$(mktemp -d /var/tmp/runwatch-fresh.XXXXXX)
root=$work/root
ns=rwfresh$$
host_if=rwf$$a
ns_if=rwf$$b
forward_was=$(cat /proc/sys/net/ipv4/ip_forward)
subnet=10.213.$(( $$ % 250 )).0/30
gateway=10.213.$(( $$ % 250 )).1
address=10.213.$(( $$ % 250 )).2
lab_pid=
cleanup() {
  set +e
  [ -n "$lab_pid" ] && kill "$lab_pid" 2>/dev/null
  # every process left in the namespace is one this tier started
  for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
  ip netns del "$ns" 2>/dev/null
  ip link del "$host_if" 2>/dev/null
  iptables -t nat -D POSTROUTING -s "$subnet" -j MASQUERADE 2>/dev/null
  iptables -D FORWARD -s "$subnet" -j ACCEPT 2>/dev/null
  iptables -D FORWARD -d "$subnet" -j ACCEPT 2>/dev/null
  echo "$forward_was" >/proc/sys/net/ipv4/ip_forward
  if [ "$keep" = 1 ]; then say "kept $root"; else rm -rf "$work"; fi
}
trap cleanup EXIT
mkdir -p "$root"
tar -C "$root" -xf "$image"

# --- what a fresh machine has of this one's: its certificate bundle, pip and apt settings, hosts ---
# The bundle where tools read it, and where Debian's ca-certificates keeps a machine's own CAs, so
# that update-ca-certificates (which installing git or curl runs) keeps them in the bundle it writes.
install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$root/usr/local/share/ca-certificates/machine-bundle.crt"
[ -e /etc/pip.conf ] && install -D -m 0644 /etc/pip.conf "$root/etc/pip.conf"
[ -d /etc/xdg/pip ] && mkdir -p "$root/etc/xdg" && cp -r /etc/xdg/pip "$root/etc/xdg/"
rm -f "$root/etc/apt/sources.list"
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list; do
  [ -e "$f" ] && install -D -m 0644 "$f" "$root$f"
done
cp /etc/apt/apt.conf.d/* "$root/etc/apt/apt.conf.d/" 2>/dev/null || true
install -m 0644 /etc/hosts "$root/etc/hosts"
install -m 0644 /etc/resolv.conf "$root/etc/resolv.conf"
git clone -q "$REPO" "$root/root/runwatch"
for drop in "${drops[@]}"; do  # an install step taken out: TARGET's line loses PREREQUISITE
  target=${drop%%:*} prereq=${drop#*:}
  before=$(grep -E "^$target:" "$root/root/runwatch/Makefile") || fail "--drop $drop: the Makefile has no target $target"
  sed -i -E "s/^($target:.*)[[:space:]]$prereq([[:space:]]|\$)/\1\2/" "$root/root/runwatch/Makefile"
  [ "$(grep -E "^$target:" "$root/root/runwatch/Makefile")" != "$before" ] || fail "--drop $drop: $target has no prerequisite $prereq"
  say "dropped $prereq from $target's prerequisites: $(grep -E "^$target:" "$root/root/runwatch/Makefile")"
done

# --- a network namespace of its own, with NAT to this machine's network for the package indexes ---
ip netns add "$ns"
ip link add "$host_if" type veth peer name "$ns_if"
ip link set "$ns_if" netns "$ns"
ip addr add "$gateway/30" dev "$host_if" && ip link set "$host_if" up
ip netns exec "$ns" ip addr add "$address/30" dev "$ns_if"
ip netns exec "$ns" ip link set "$ns_if" up
ip netns exec "$ns" ip link set lo up
ip netns exec "$ns" ip route add default via "$gateway"
echo 1 >/proc/sys/net/ipv4/ip_forward
iptables -t nat -A POSTROUTING -s "$subnet" -j MASQUERADE
iptables -A FORWARD -s "$subnet" -j ACCEPT
iptables -A FORWARD -d "$subnet" -j ACCEPT

# One shell command in the root, as a fresh root login runs it, in the clone: its own mount
# namespace (proc, sys, dev), this tier's network namespace, nothing of this environment.
in_root() {
  ip netns exec "$ns" unshare --mount --propagation private --fork bash -c '
    root=$1; shift
    # the root a mount point of its own, as a machine'"'"'s / is (a mount namespace made in a
    # chroot whose / is not one cannot set its propagation: Alertmanager'"'"'s launcher makes one)
    mount --bind "$root" "$root" &&
      mount -t proc proc "$root/proc" && mount -t sysfs sys "$root/sys" && mount --rbind /dev "$root/dev" &&
      exec chroot "$root" /usr/bin/env -i HOME=/root USER=root LOGNAME=root SHELL=/bin/bash TERM=dumb \
        LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        bash -c "cd /root/runwatch && $*"' in-root "$root" "$@"
}
elapsed() { local s=$(( $(date +%s) - $1 )); printf '%d:%02d' $((s / 60)) $((s % 60)); }

# 1. the set-up lines
for line in "${commands[@]}"; do
  case $line in
    "make lab"|"make test") continue ;;
    "git clone "*|"cd "*) say "\$ $line   (the clone of this checkout's HEAD is in place)"; continue ;;
  esac
  say "\$ $line"
  line=${line#sudo }  # as root, which this tier is, sudo runs the rest; a bare Debian has no sudo
  t=$(date +%s)
  in_root "$line" || fail "README's set-up line failed: $line"
  say "set-up line done in $(elapsed "$t")"
done

# 2. make lab, until every component answers; then down from a second shell
say "\$ make lab"
t=$(date +%s)
log=$work/make-lab.log
in_root "make lab" >"$log" 2>&1 &
lab_pid=$!
until grep -q 'stop with `runwatch down`' "$log"; do  # its last start-up line, through a pipe
  kill -0 "$lab_pid" 2>/dev/null || { tail -n 15 "$log" >&2; fail "make lab exited before the lab was up"; }
  [ $(( $(date +%s) - t )) -lt $((LAB_READY_S + 600)) ] || { tail -n 15 "$log" >&2; fail "make lab printed no start-up line"; }
  sleep 1
done
say "make lab: the lab is up after $(elapsed "$t") (set-up included)"
ip netns exec "$ns" python3 "$REPO/tests/fresh_lab_answers.py" "$root/root/runwatch" ||
  { tail -n 15 "$log" >&2; fail "make lab: a component does not answer"; }
in_root ".venv/bin/runwatch down" >&2 || fail "runwatch down failed"
wait "$lab_pid" || { tail -n 15 "$log" >&2; fail "make lab exited with status $? after runwatch down"; }
lab_pid=
grep -q 'the lab was stopped by `runwatch down`' "$log" || { tail -n 5 "$log" >&2; fail "make lab did not report down"; }

# 3. make test
say "\$ make test"
t=$(date +%s)
in_root "make test" || fail "make test failed on the fresh machine (after $(elapsed "$t"))"
say "make test passed on the fresh machine in $(elapsed "$t") (set-up of its own included)"
say "the tier passed in $(elapsed "$tier_started")"

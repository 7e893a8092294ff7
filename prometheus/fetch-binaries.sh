#!/usr/bin/env bash
# Fetch the Prometheus and Alertmanager that production clusters run today, for the lab and its
# tests: Prometheus 3.5 (the long-term-support line, with promtool) and Alertmanager 0.33 (with
# amtool), from Debian's unstable suite (sid), into a folder of runwatch's own:
#
#   ${RUNWATCH_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/runwatch/bin}/{prometheus,promtool,alertmanager,amtool}
#   .../share/prometheus/{alertmanager,web}: Debian's /usr/share/prometheus, which its builds read
#
# Debian's Alertmanager reads its notification template from a path compiled into it,
# /usr/share/prometheus/alertmanager/default.tmpl; the lab gives it this folder's copy there in a
# mount namespace of its own (runwatch/prom/tools.py, alertmanager_launch), so nothing is written
# under /usr and a Debian prometheus-alertmanager package, installed or not, is never touched.
#
# Nothing is installed over the machine's own packages: apt reads a sources list, package lists
# and a cache of this script's own (APT_CONFIG; /etc/apt is left untouched), `apt-get download`
# fetches the three .debs and `dpkg-deb -x` unpacks them. Debian 12 ships Prometheus 2.42 and
# Alertmanager 0.25 (2023); their binaries run unchanged on it (they link only libc).
# The archive is the one the machine's own apt sources name. Idempotent: binaries of the wanted
# lines already in place are kept. VERSIONS in the folder records what was fetched.
#
# Usage: prometheus/fetch-binaries.sh [--force]
set -euo pipefail

PROMETHEUS_LINE=3.5    # Prometheus's LTS line, as kube-prometheus-stack's Prometheus 3 reads rules
ALERTMANAGER_LINE=0.33
DEST=${RUNWATCH_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/runwatch/bin}

say() { echo "fetch-binaries: $*" >&2; }
fail() { say "$*"; exit 1; }

version_of() { # the version a binary reports: "prometheus, version 3.5.3+ds1 (...)" -> 3.5.3+ds1
  "$1" --version 2>&1 | sed -n 's/^[a-z]*, version \([^ ]*\).*/\1/p' | head -n 1
}
have() {
  [ "${1:-}" != --force ] || return 1
  for b in prometheus promtool alertmanager amtool; do [ -x "$DEST/$b" ] || return 1; done
  [ -r "$DEST/share/prometheus/alertmanager/default.tmpl" ] || return 1 # a folder from before it was kept
  case $(version_of "$DEST/prometheus") in "$PROMETHEUS_LINE".*) ;; *) return 1 ;; esac
  case $(version_of "$DEST/alertmanager") in "$ALERTMANAGER_LINE".*) ;; *) return 1 ;; esac
}
if have "${1:-}"; then
  say "$(version_of "$DEST/prometheus") and Alertmanager $(version_of "$DEST/alertmanager") in $DEST"
  exit 0
fi

command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null ||
  fail "needs apt-get and dpkg-deb (Debian or Ubuntu); or put Prometheus $PROMETHEUS_LINE.x and Alertmanager $ALERTMANAGER_LINE.x binaries in $DEST"

# The Debian archive exactly as this machine's apt sources name it (deb822 or one-line format).
archive=$(
  { grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}'
    grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | sed 's/\[[^]]*\]//' | awk '{print $2}'
  } | grep -m1 -E '/debian/?$' || true
)
[ -n "$archive" ] || fail "no Debian archive in /etc/apt/sources.list or /etc/apt/sources.list.d/: cannot fetch from sid"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -r "$keyring" ] || fail "$keyring is missing: apt-get install debian-archive-keyring"

work=$(mktemp -d "${TMPDIR:-/tmp}/runwatch-fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/debs" "$work/root"
echo "deb [signed-by=$keyring] $archive sid main" >"$work/sources.list"
cat >"$work/apt.conf" <<EOF
Dir::Etc::SourceList "$work/sources.list";
Dir::Etc::SourceParts "/nonexistent";
Dir::State::Lists "$work/lists";
Dir::Cache "$work/cache";
APT::Sandbox::User "root";
EOF
export APT_CONFIG=$work/apt.conf

say "reading Debian sid's package lists from $archive"
apt-get update -qq >"$work/update.log" 2>&1 || fail "apt-get update of sid failed: $(tail -n 1 "$work/update.log")"
for pkg in prometheus promtool prometheus-alertmanager; do
  line=$PROMETHEUS_LINE
  [ "$pkg" = prometheus-alertmanager ] && line=$ALERTMANAGER_LINE
  candidate=$(apt-cache policy "$pkg" | sed -n 's/^ *Candidate: //p')
  case $candidate in
    "$line".*) ;;
    *) fail "sid has $pkg ${candidate:-(none)}, not the $line line this lab is written for" ;;
  esac
  (cd "$work/debs" && apt-get download -qq "$pkg=$candidate" >"$work/download.log" 2>&1) ||
    fail "apt-get download $pkg=$candidate failed: $(tail -n 1 "$work/download.log")"
done
for deb in "$work"/debs/*.deb; do dpkg-deb -x "$deb" "$work/root"; done

# Into place whole: a new folder beside the old one, then one rename.
mkdir -p "$(dirname "$DEST")"
new=$(mktemp -d "$DEST.new.XXXXXX")
cp "$work/root/usr/bin/prometheus" "$work/root/usr/bin/promtool" "$work/root/usr/bin/amtool" "$new/"
cp "$work/root/usr/bin/prometheus-alertmanager" "$new/alertmanager" # upstream's name
# Debian's /usr/share/prometheus as its package lays it out: Alertmanager's templates (which the
# native lab's Alertmanager reads, above) and the web assets (no UI in its 3.x build: the page that
# says so), also for the look-alike images that compose/podman/build-images.sh builds.
mkdir -p "$new/share"
cp -r "$work/root/usr/share/prometheus" "$new/share/prometheus"
[ -r "$new/share/prometheus/alertmanager/default.tmpl" ] ||
  fail "prometheus-alertmanager's package has no usr/share/prometheus/alertmanager/default.tmpl: its layout changed"
chmod 0755 "$new"
{ for b in prometheus promtool alertmanager amtool; do echo "$b $(version_of "$new/$b")"; done
  echo "from $archive sid on $(date -u +%Y-%m-%d)"; } >"$new/VERSIONS"
rm -rf "$DEST.old"
[ -e "$DEST" ] && mv "$DEST" "$DEST.old"
mv "$new" "$DEST"
rm -rf "$DEST.old"
say "$(tr '\n' ';' <"$DEST/VERSIONS" | sed 's/;$//; s/;/; /g') -> $DEST"

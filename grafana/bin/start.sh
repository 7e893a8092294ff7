#!/bin/sh
# Grafana's entrypoint in docker-compose.yml: choose the admin password, then run Grafana's own
# /run.sh. No admin/admin, and nothing any compose command must be given:
#   - GRAFANA_ADMIN_PASSWORD (from the environment, or from .env beside docker-compose.yml,
#     which git ignores) is used when set;
#   - otherwise a random password is generated once and kept in Grafana's volume, and this
#     prints where to read it.
# Grafana applies the password when it creates its database, on the first start of the volume.
set -eu
data=${GF_PATHS_DATA:-/var/lib/grafana}
file=$data/admin-password
umask 077
if [ -n "${GRAFANA_ADMIN_PASSWORD:-}" ]; then
  printf '%s' "$GRAFANA_ADMIN_PASSWORD" >"$file"
elif [ ! -s "$file" ]; then
  od -An -N18 -tx1 /dev/urandom | tr -d ' \n' >"$file"
  echo "runwatch: generated Grafana's admin password; read it with: docker compose exec grafana cat $file"
fi
GF_SECURITY_ADMIN_PASSWORD__FILE=$file
export GF_SECURITY_ADMIN_PASSWORD__FILE
unset GRAFANA_ADMIN_PASSWORD
exec "${GRAFANA_RUN:-/run.sh}" "$@"

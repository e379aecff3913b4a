# Sourced by local-cluster.sh and cluster.sh.
#
# client_keys AUTH_DIR OUT_DIR NAME...: OUT_DIR gets what a tenant's host holds (docs/SECURITY.md "Deploying keys"):
# the roster, cluster.pub and the key pairs of the client identities NAME...; never cluster.secret, grant.key, the
# admin's or a daemon's keys, nor etcd's certificates. Modes 700 (directories) and 600 (secrets), as Keyring::load
# requires.
client_keys() {
  local from="$1" to="$2"
  shift 2
  mkdir -p -m 700 "$to/ids"
  chmod 700 "$to"
  cp -p "$from/roster" "$from/cluster.pub" "$to/"
  local name
  for name in "$@"; do cp -p "$from/ids/$name.pub" "$from/ids/$name.secret" "$to/ids/"; done
}

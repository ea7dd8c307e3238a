#!/usr/bin/env bash
# controlplane.sh builds the local control plane (kube-apiserver,
# kube-controller-manager, etcd, nats-server) from the Go module proxy and
# caches the binaries under the user cache dir. The first three are built by
# reconcile/envtest/cmd/envtest-build, which users of package envtest run
# with go run ...@latest; this script adds nats-server for the example.
#
#   hack/controlplane.sh build    build whatever is missing (idempotent), print the bin dir
#   hack/controlplane.sh bindir   print the bin dir (does not build)
#   hack/controlplane.sh check    exit 0 if every binary is present
#
# Nothing is downloaded but Go modules: no prebuilt binaries.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

K8S_VERSION="${K8S_VERSION:-v1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
NATS_VERSION="${NATS_VERSION:-v2.15.2}"

log() { printf '[controlplane] %s\n' "$*" >&2; }
die() { printf '[controlplane] ERROR: %s\n' "$*" >&2; exit 1; }

# The same places as envtest.DefaultBinDir: $OPKIT_CONTROLPLANE_BIN
# if set, else Go's user cache dir (os.UserCacheDir refuses a relative
# XDG_CACHE_HOME, so this script does too rather than build where the tests
# will not look).
if [[ -n "${XDG_CACHE_HOME:-}" && "$XDG_CACHE_HOME" != /* ]]; then
  die "XDG_CACHE_HOME=$XDG_CACHE_HOME is relative; Go (and the tests) ignore it: make it absolute"
fi
if [[ -z "${XDG_CACHE_HOME:-}" && -z "${HOME:-}" ]]; then
  die "neither XDG_CACHE_HOME nor HOME is set: there is no user cache dir to build in"
fi
if [[ -n "${OPKIT_CONTROLPLANE_BIN:-}" && "$OPKIT_CONTROLPLANE_BIN" != /* ]]; then
  die "OPKIT_CONTROLPLANE_BIN=$OPKIT_CONTROLPLANE_BIN is relative; tests run in their own package directories: make it absolute"
fi
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/opkit"
bindir="${OPKIT_CONTROLPLANE_BIN:-$cache_root/k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_nats-${NATS_VERSION}/bin}"
workdir="$cache_root/build"

command -v go >/dev/null || die "go is not on PATH; install Go 1.26 first"

# kube-apiserver, kube-controller-manager and etcd are built by the command
# package envtest documents for its users (the same build, the same cache):
# one implementation, which a user's project runs with go run ...@latest.
build_control_plane() {
  (cd "$root" && go run ./reconcile/envtest/cmd/envtest-build \
    -kubernetes "$K8S_VERSION" -etcd "$ETCD_VERSION" -o "$bindir" -work "$workdir" >/dev/null) \
    || die "reconcile/envtest/cmd/envtest-build failed"
}

build_nats() {
  local out="$bindir/nats-server"
  if [[ -x "$out" ]]; then log "nats-server $NATS_VERSION: cached at $out"; return; fi
  log "nats-server $NATS_VERSION: go install (about 35 s)"
  local gobin="$workdir/nats-$NATS_VERSION"
  mkdir -p "$gobin"
  CGO_ENABLED=0 GOBIN="$gobin" go install -trimpath -ldflags "-s -w" "github.com/nats-io/nats-server/v2@$NATS_VERSION" \
    || die "go install of nats-server failed"
  # via a temporary name beside the final one: across file systems mv
  # copies, and an interrupted copy must not look like a cached binary
  mv "$gobin/nats-server" "$out.tmp"
  mv "$out.tmp" "$out"
  log "nats-server: built $out"
}

cmd="${1:-build}"
case "$cmd" in
  build)
    modcache=$(go env GOMODCACHE) || die "go env failed"
    [[ -n "$modcache" ]] || die "Go has no module cache (GOMODCACHE is empty: set HOME, GOPATH or GOMODCACHE)"
    mkdir -p "$bindir" "$workdir"
    # envtest-build takes the build lock itself; nats-server is built
    # under it afterwards. Each binary is checked again once the lock is
    # held, so a waiting run reuses what another one built (make test and
    # make demo in two terminals, two clones).
    build_control_plane
    if command -v flock >/dev/null; then
      exec 9>"$workdir/build.lock"
      if ! flock -n 9; then
        log "another build holds $workdir/build.lock: waiting for it"
        flock 9
      fi
    fi
    build_nats
    echo "$bindir"
    ;;
  bindir) echo "$bindir" ;;
  check)
    for b in kube-apiserver kube-controller-manager etcd nats-server; do [[ -x "$bindir/$b" ]] || { log "missing $bindir/$b (run: hack/controlplane.sh build)"; exit 1; }; done
    echo "$bindir"
    ;;
  *) die "unknown command '$cmd' (want build, bindir or check)" ;;
esac

#!/usr/bin/env bash
# controlplane.sh builds the local control plane (kube-apiserver,
# kube-controller-manager, etcd, nats-server) from the Go module proxy and
# caches the binaries under the user cache dir.
#
#   hack/controlplane.sh build    build whatever is missing (idempotent), print the bin dir
#   hack/controlplane.sh bindir   print the bin dir (does not build)
#   hack/controlplane.sh check    exit 0 if every binary is present
#
# Nothing is downloaded but Go modules: no prebuilt binaries.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.37.2}"
STAGING_VERSION="${STAGING_VERSION:-v0.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
NATS_VERSION="${NATS_VERSION:-v2.15.2}"

log() { printf '[controlplane] %s\n' "$*" >&2; }
die() { printf '[controlplane] ERROR: %s\n' "$*" >&2; exit 1; }

# The same places as internal/testcluster.DefaultBinDir: $OPKIT_CONTROLPLANE_BIN
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

# The Kubernetes binaries (kube-apiserver, kube-controller-manager) come from
# one build module: its module graph is resolved once for both, and the second
# build reuses most of the first one's compiled packages from Go's build cache.
k8s_mod="$workdir/kubernetes-$K8S_VERSION"
k8s_binaries=(kube-apiserver kube-controller-manager)

# prepare_k8s_module writes the build module that requires k8s.io/kubernetes
# with every staging module replaced by its published release, and resolves
# its module graph. It runs at most once per invocation.
k8s_mod_ready=
prepare_k8s_module() {
  [[ -z "$k8s_mod_ready" ]] || return 0
  mkdir -p "$k8s_mod"
  log "kubernetes $K8S_VERSION: preparing build module in $k8s_mod"
  (
    cd "$k8s_mod"
    rm -f go.mod go.sum
    go mod init opkit.local/controlplane/kubernetes >/dev/null 2>&1
    log "kubernetes: fetching k8s.io/kubernetes@$K8S_VERSION go.mod"
    local gomod
    gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
    [[ -f "$gomod" ]] || die "could not download k8s.io/kubernetes@$K8S_VERSION from the module proxy"
    # Every k8s.io/* module that kubernetes replaces with a staging directory is
    # published on its own at the matching v0.x version: point the replace there.
    local staged
    staged=$(grep -E '^[[:space:]]*(replace[[:space:]]+)?k8s\.io/[^ ]+[[:space:]]+=>[[:space:]]+\./staging/' "$gomod" \
      | sed -E 's/^[[:space:]]*(replace[[:space:]]+)?(k8s\.io\/[^ ]+).*/\2/' | sort -u)
    [[ -n "$staged" ]] || die "found no staging replace directives in $gomod"
    {
      echo "module opkit.local/controlplane/kubernetes"
      echo
      echo "go 1.26"
      echo
      echo "require k8s.io/kubernetes $K8S_VERSION"
      echo
      echo "replace ("
      for m in $staged; do echo "	$m => $m $STAGING_VERSION"; done
      echo ")"
    } > go.mod
    log "kubernetes: replaced $(echo "$staged" | wc -l) staging modules with $STAGING_VERSION; resolving module graph"
    {
      echo "//go:build tools"
      echo
      echo "package tools"
      echo
      echo "import ("
      for b in "${k8s_binaries[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$b\""; done
      echo ")"
    } > tools.go
    GOFLAGS=-mod=mod go mod tidy >/dev/null 2>tidy.log || { cat tidy.log >&2; die "go mod tidy failed for kubernetes"; }
  )
  k8s_mod_ready=1
}

# build_k8s NAME HOW_LONG builds k8s.io/kubernetes/cmd/NAME into the bin dir
# unless it is there already; HOW_LONG is for the log.
build_k8s() {
  local name="$1" how_long="$2"
  local out="$bindir/$name"
  if [[ -x "$out" ]]; then log "$name $K8S_VERSION: cached at $out"; return; fi
  prepare_k8s_module
  log "$name $K8S_VERSION: compiling ($how_long)"
  (
    cd "$k8s_mod"
    local pkg=k8s.io/component-base/version
    local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
    CGO_ENABLED=0 go build -trimpath -o "$out.tmp" \
      -ldflags "-s -w -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean" \
      "k8s.io/kubernetes/cmd/$name" || die "go build of $name failed"
    mv "$out.tmp" "$out"
  )
  log "$name: built $out"
}

build_etcd() {
  local out="$bindir/etcd"
  if [[ -x "$out" ]]; then log "etcd $ETCD_VERSION: cached at $out"; return; fi
  local mod="$workdir/etcd-$ETCD_VERSION"
  mkdir -p "$mod"
  log "etcd $ETCD_VERSION: preparing build module in $mod"
  (
    cd "$mod"
    rm -f go.mod go.sum
    cat > go.mod <<GOMOD
module opkit.local/controlplane/etcd

go 1.26

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
GOMOD
    cat > main.go <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
    GOFLAGS=-mod=mod go mod tidy >/dev/null 2>tidy.log || { cat tidy.log >&2; die "go mod tidy failed for etcd"; }
    log "etcd: compiling"
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out.tmp" . || die "go build of etcd failed"
    mv "$out.tmp" "$out"
  )
  log "etcd: built $out"
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
    # One build at a time per cache (make test and make demo in two
    # terminals, two clones): they share the build modules. Each binary is
    # checked again once the lock is held, so a waiting run reuses what
    # the other built.
    if command -v flock >/dev/null; then
      exec 9>"$workdir/build.lock"
      if ! flock -n 9; then
        log "another build holds $workdir/build.lock: waiting for it"
        flock 9
      fi
    fi
    build_etcd
    build_k8s kube-apiserver "about 5 minutes cold on 2 cores"
    build_k8s kube-controller-manager "about 4 minutes on 2 cores after kube-apiserver"
    build_nats
    echo "$bindir"
    ;;
  bindir) echo "$bindir" ;;
  check)
    for b in "${k8s_binaries[@]}" etcd nats-server; do [[ -x "$bindir/$b" ]] || { log "missing $bindir/$b (run: hack/controlplane.sh build)"; exit 1; }; done
    echo "$bindir"
    ;;
  *) die "unknown command '$cmd' (want build, bindir or check)" ;;
esac

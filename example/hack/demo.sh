#!/usr/bin/env bash
# demo.sh: the reference operator end to end on a local control plane
# (what `make demo` runs). Needs only Go: the control plane binaries
# (kube-apiserver, kube-controller-manager, etcd, nats-server) are built from the Go module proxy
# and cached by hack/controlplane.sh on first use (about 5 minutes cold).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
example="$(dirname "$here")"
root="$(dirname "$example")"

if ! "$root/hack/controlplane.sh" check >/dev/null 2>&1; then
  echo "==> building the control plane binaries (cached for next time)"
  "$root/hack/controlplane.sh" build
fi

# Build the driver first so that Ctrl-C reaches it directly (not go run).
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "==> building the demo driver"
(cd "$example" && go build -buildvcs=false -o "$work/demo" ./hack/demo)
cd "$example"
"$work/demo" -module "$example" "$@"

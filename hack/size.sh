#!/usr/bin/env bash
# size.sh prints the SDK's size figures, next to the targets the size issue
# sets, as a short plain-text report (`make size`). It only reports: it exits
# 0 whatever the figures (it is not a gate). It needs only Go and the usual
# shell tools, and runs from anywhere.
#
# The SDK is the non-test Go of the root package, queue, watcher, leader,
# trigger, reconcile and their subpackages, and internal/typed (hack/,
# example/, bench/ and the other internal packages are not part of it).
# Its line count drops comment lines and blank lines, with the pipeline
# docs/architecture.md's "Size" section gives.
# Last, it counts the peers' parts that do the same jobs as each opkit
# package (client-go and controller-runtime at bench's versions) the same way.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
GO=${GO:-go}

# go_files prints the non-test .go files of the root package (with "."),
# or of the given directories and everything under them.
go_files() {
  if [[ $1 == . ]]; then
    ls *.go
  else
    find "$@" -name '*.go'
  fi | grep -v '_test.go$'
}

# code_lines counts the lines of the files read from stdin that are neither
# comment lines nor blank (a count of 0 is not an error).
code_lines() {
  xargs grep -hv '^\s*//' | { grep -cv '^\s*$' || true; }
}

# doc_lines prints the line count of `go doc -all` for the packages given.
doc_lines() {
  local n=0 p
  for p in "$@"; do
    n=$((n + $("$GO" doc -all "$p" | wc -l)))
  done
  echo "$n"
}

# sizecount runs hack/sizecount (go/parser, standard library only).
sizecount() { "$GO" run ./hack/sizecount "$@"; }

# row prints a label, a figure and, if given, its target.
row() { printf '  %-40s %6s%s\n' "$1" "$2" "${3:+  $3}"; }

# Plain command substitutions (no paths here hold spaces), so that a failure
# stops the script under set -e.
sdk_dirs=(queue watcher leader trigger reconcile internal/typed)
sdk=($(go_files .) $(go_files "${sdk_dirs[@]}"))
trigger_pkgs=($("$GO" list ./trigger/...))
reconcile_pkgs=($("$GO" list ./reconcile/...))

echo "SDK lines: non-test Go, without comment and blank lines"
row "SDK total" "$(printf '%s\n' "${sdk[@]}" | code_lines)" "target <= 6500"
row "root package" "$(go_files . | code_lines)"
for d in "${sdk_dirs[@]}"; do
  name=$d
  if (($("$GO" list "./$d/..." | wc -l) > 1)); then
    name="$d with subpackages"
  fi
  row "$name" "$(go_files "$d" | code_lines)"
done

echo
echo "go doc -all lines"
row "./trigger" "$(doc_lines ./trigger)"
row "./trigger with subpackages (${#trigger_pkgs[@]} packages)" "$(doc_lines "${trigger_pkgs[@]}")" "target <= 700"
row "./reconcile" "$(doc_lines ./reconcile)" "target <= 450"
row "./reconcile with subpackages (${#reconcile_pkgs[@]} packages)" "$(doc_lines "${reconcile_pkgs[@]}")"

echo
echo "Exported declarations of trigger with its subpackages (funcs, methods of"
echo "exported types, types, const and var names)"
trigger_files=($(go_files trigger))
sizecount exported "${trigger_files[@]}" | sed -e 's/^/  /' -e 's/^  total .*/&  target <= 80/'

echo
echo "The 10 longest SDK functions (lines from func to the closing brace)"
sizecount longest 10 "${sdk[@]}" | sed 's/^/  /'

echo
long=$(sizecount over 80 "${sdk[@]}")
echo "SDK functions over 80 lines: $(grep -c . <<<"$long" || true)  target 0"
[[ -z $long ]] || sed 's/^/  /' <<<"$long"

echo
big=$(for f in "${sdk[@]}"; do
  n=$(wc -l <"$f")
  if ((n > 600)); then printf '%4d  %s\n' "$n" "$f"; fi
done | sort -rn)
echo "Non-test SDK files over 600 lines: $(grep -c . <<<"$big" || true)  target 0"
[[ -z $big ]] || sed 's/^/  /' <<<"$big"

# The peers' parts that do the same jobs, counted with the same pipeline,
# at the versions the bench module pins (their sources come from the Go
# module cache, downloaded first if missing). Left out: client-go's
# leasecandidate.go (coordinated leader election, another feature) and
# controller-runtime's envtest/komega (Gomega helpers).
echo
echo "Next to the peers' parts that do the same jobs (versions of bench/go.mod)"
peers=(k8s.io/client-go sigs.k8s.io/controller-runtime)
dirs=$(cd bench && "$GO" mod download "${peers[@]}" && "$GO" list -m -f '{{.Dir}}' "${peers[@]}") || dirs=
{ read -r cg || true; read -r cr || true; } <<<"$dirs"
if [[ ! -d ${cg:-} || ! -d ${cr:-} ]]; then
  echo "  unavailable: bench's modules cannot be downloaded"
  exit 0
fi
# peer_lines counts the non-test, non-generated Go files directly in the
# given directories (or, with -r first, under them), but the excluded.
peer_lines() {
  local depth="-maxdepth 1"
  if [[ $1 == -r ]]; then
    depth=
    shift
  fi
  find "$@" $depth -name '*.go' ! -name '*_test.go' ! -name 'zz_generated*' ! -name leasecandidate.go ! -path '*/komega/*' | code_lines
}
pair() { printf '  %-24s %6s   %-34s %6s\n' "$1" "$2" "$3" "$4"; }
echo "  (client-go $(basename "$cg" | cut -d@ -f2) and controller-runtime, CR, $(basename "$cr" | cut -d@ -f2))"
pair "opkit" "lines" "the peers' parts" "lines"
pair "queue" "$(go_files queue | code_lines)" \
  "workqueue + CR priorityqueue" "$(peer_lines "$cg/util/workqueue" "$cr/pkg/controller/priorityqueue")"
pair "watcher" "$(go_files watcher | code_lines)" "reflector, informer and stores" \
  "$(cd "$cg/tools/cache" && ls reflector.go listwatch.go controller.go shared_informer.go delta_fifo.go store.go thread_safe_store.go index.go | code_lines)"
pair "leader" "$(go_files leader | code_lines)" "leaderelection with resourcelock" "$(peer_lines -r "$cg/tools/leaderelection")"
# The CR row: reconcile, controller, internal/controller, handler, source,
# manager, leaderelection, healthz and controller/controllerutil.
pair "reconcile (the package)" "$(ls reconcile/*.go | grep -v '_test.go$' | code_lines)" \
  "CR controller stack, manager, utils" "$(peer_lines "$cr"/pkg/{reconcile,controller,internal/controller,handler,source,manager,leaderelection,healthz,controller/controllerutil})"
pair "reconcile/reconciletest" "$(go_files reconcile/reconciletest | code_lines)" "CR client/fake" "$(peer_lines "$cr/pkg/client/fake")"
pair "reconcile/envtest" "$(go_files reconcile/envtest | code_lines)" "CR envtest with internal/testing" "$(peer_lines -r "$cr/pkg/envtest" "$cr/pkg/internal/testing")"
pair "trigger" "$(go_files trigger | code_lines)" "(none takes external triggers)" "-"
exit 0

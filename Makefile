# opkit's developer and CI entry points. The README opens with the two that
# matter: `make demo` and `make test`. Everything works on a machine that has
# only Go, make and gcc (-race needs cgo): the control plane is built from the Go module proxy by
# hack/controlplane.sh and cached under the user cache dir.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := test

GO ?= go
# The modules: the SDK at the root, plus example/ and bench/ when they exist.
MODULES := . $(patsubst %/go.mod,%,$(wildcard example/go.mod bench/go.mod))

UNIT_TIMEOUT ?= 10m
INTEGRATION_TIMEOUT ?= 20m
# Per fuzz target: brief in `make test`, longer in `make fuzz`.
FUZZTIME ?= 10s
LONG_FUZZTIME ?= 2m
BENCH_COUNT ?= 6
BENCH_OUT ?= bench/bench.out

# log prints a step header.
log = printf '\n==> %s\n' "$(1)"

.PHONY: test controlplane-bin fmt-check vet unit integration fuzz-brief \
        demo controlplane bench fuzz fmt size

## test: build what is missing, then gofmt check, vet, unit and integration
## tests with -race, and a brief fuzz run, for every module. Benchmarks are
## compiled (by the test steps, which build every _test.go) but not run.
test: controlplane-bin fmt-check vet unit integration fuzz-brief
	@$(call log,make test: all passed)

## controlplane-bin: build kube-apiserver, kube-controller-manager, etcd and
## nats-server if missing.
controlplane-bin:
	@$(call log,control plane binaries)
	hack/controlplane.sh build

# fmt-check skips hidden directories (a repo-local .cache, say).
fmt-check:
	@$(call log,gofmt check)
	@bad=$$(find . -name '.?*' -prune -o -name '*.go' -print | xargs -r gofmt -l); \
	if [[ -n "$$bad" ]]; then echo "gofmt needed (run make fmt):"; echo "$$bad"; exit 1; fi

# vet runs with and without the integration tag so that both sets of test
# files (benchmarks included) are type-checked.
vet:
	@for m in $(MODULES); do \
	  $(call log,go vet $$m); \
	  (cd $$m && $(GO) vet ./... && $(GO) vet -tags integration ./...); \
	done

unit:
	@for m in $(MODULES); do \
	  $(call log,unit tests $$m); \
	  (cd $$m && $(GO) test -race -timeout $(UNIT_TIMEOUT) ./...); \
	done

# GREP_SOME is grep for use under xargs and pipefail: no match (grep's
# exit 1, e.g. a module without integration tests) is not a failure, a real
# error (exit 2) still is.
GREP_SOME = sh -c 'grep "$$@"; rc=$$?; [ $$rc -le 1 ]' grep

# integration runs, with -tags integration and -race, the packages that have
# integration test files (they also rerun their unit tests). -count=1: the
# results depend on processes the go test cache cannot see.
integration: controlplane-bin
	@for m in $(MODULES); do \
	  pkgs=$$(cd $$m && $(GO) list -tags integration \
	    -f '{{$$d := .Dir}}{{range .TestGoFiles}}{{$$d}}/{{.}} {{end}}{{range .XTestGoFiles}}{{$$d}}/{{.}} {{end}}' ./... \
	    | xargs -r $(GREP_SOME) -l '^//go:build.*integration' | xargs -r -n1 dirname | sort -u); \
	  if [[ -z "$$pkgs" ]]; then $(call log,integration tests $$m: none); continue; fi; \
	  $(call log,integration tests $$m); \
	  (cd $$m && $(GO) test -race -count=1 -tags integration -timeout $(INTEGRATION_TIMEOUT) $$pkgs); \
	done

# fuzz-targets prints "dir FuzzName" for every fuzz target of module $(1),
# found in the test files, so new targets need no Makefile change. It runs
# inside $$(...), so the cd does not leak.
define fuzz-targets
cd $(1) && $(GO) list -f '{{$$d := .Dir}}{{range .TestGoFiles}}{{$$d}}/{{.}} {{end}}{{range .XTestGoFiles}}{{$$d}}/{{.}} {{end}}' ./... \
  | xargs -r $(GREP_SOME) -Ho '^func Fuzz[A-Za-z0-9_]*' \
  | sed -E 's#^(.*)/[^/]+:func (Fuzz[A-Za-z0-9_]*)$$#\1 \2#' | sort -u
endef

# run-fuzz runs every fuzz target of every module for $(1) each.
define run-fuzz
for m in $(MODULES); do \
  targets=$$($(call fuzz-targets,$$m)); \
  if [[ -z "$$targets" ]]; then $(call log,fuzz $$m: no targets); continue; fi; \
  while read -r dir name; do \
    $(call log,fuzz $$name in $$dir for $(1)); \
    (cd $$m && $(GO) test -run='^$$' -fuzz="^$$name\$$" -fuzztime=$(1) "$$dir"); \
  done <<< "$$targets"; \
done
endef

fuzz-brief:
	@$(call run-fuzz,$(FUZZTIME))

## fuzz: every fuzz target for LONG_FUZZTIME (default 2m) each.
fuzz:
	@$(call run-fuzz,$(LONG_FUZZTIME))

## demo: the reference operator end to end on a local control plane
## (example/hack/demo.sh).
demo: controlplane-bin
	@$(call log,demo: example/hack/demo.sh)
	bash example/hack/demo.sh

## controlplane: start etcd + kube-apiserver by hand; prints the kubeconfig,
## stops on Ctrl-C. CONTROLPLANE_ARGS=-apiservers=2 for an HA pair,
## CONTROLPLANE_ARGS=-controller-manager to add a kube-controller-manager
## (garbage collection, namespace deletion, default service accounts).
controlplane: controlplane-bin
	$(GO) run ./internal/testcluster/cmd/controlplane $(CONTROLPLANE_ARGS)

## bench: run the bench module's benchmarks BENCH_COUNT times into BENCH_OUT.
bench: controlplane-bin
	@[[ -f bench/go.mod ]] || { echo "no bench module"; exit 1; }
	@$(call log,benchmarks -> $(BENCH_OUT))
	cd bench && $(GO) test -run='^$$' -bench=. -benchmem -count=$(BENCH_COUNT) -timeout 120m ./... | tee $(abspath $(BENCH_OUT))

## size: print the SDK's size figures (hack/size.sh)
size:
	GO=$(GO) hack/size.sh

## fmt: gofmt every module.
fmt:
	gofmt -w .

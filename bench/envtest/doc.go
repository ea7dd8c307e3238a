// Package envtestbench uses package envtest the way an operator's own
// module does: from outside opkit's root module, with the binaries laid out
// as setup-envtest lays them out ($KUBEBUILDER_ASSETS). Its integration
// tests run a Website operator (a CRD from a file, a controller that Owns
// its ConfigMap) and check what only a real control plane shows: a deleted
// child recreated, a deleted owner's children garbage-collected, a trigger
// authenticated with a ServiceAccount token, and bad input failing with a
// clear error and nothing left behind. BenchmarkStartup measures the
// start-up next to controller-runtime's envtest with the same binaries;
// the figures are in docs/benchmarks.md.
package envtestbench

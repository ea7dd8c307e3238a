// Package watcherbench measures opkit's watcher against client-go's
// SharedIndexInformer (through dynamicinformer, and typed with the Go type
// the watcher decodes into) on the same real control plane: the time of an
// initial sync of 10,000 custom objects of about 1 KB each, and the heap
// each keeps per object once synced.
//
// The benchmarks start a private control plane (internal/testcluster) on
// first use and skip when its binaries are missing. The benchmark goroutine
// owns every watcher and informer it starts and stops it before the next
// iteration.
package watcherbench

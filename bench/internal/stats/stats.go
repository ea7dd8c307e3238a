// Package stats holds the summary statistics the bench module's
// benchmarks report, and the live-heap measurement of the memory ones, so
// that every package computes them the same way.
package stats

import (
	"math"
	"runtime"
	"time"
)

// Percentile returns the nearest-rank q-quantile (0 < q <= 1) of sorted,
// or 0 if sorted is empty. With n samples, every q above (n-1)/n is the
// largest sample: the p99 of fewer than 100 samples is their maximum.
func Percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// LiveHeap returns the heap in use after two full collections (the second
// frees what finalizers of the first released): what a benchmark's
// structures retain, measured before and after building them.
func LiveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// Package stats holds the summary statistics the bench module's
// benchmarks report, the live-heap measurement of the memory ones and the
// reading of a process's CPU time (the API server's), so that every
// package computes them the same way.
package stats

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
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

// CPUSeconds returns the user and system CPU time process pid has used so
// far, from /proc/<pid>/stat (Linux): for the API server's CPU over a
// benchmark's window, the difference of two readings.
func CPUSeconds(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command name (in parentheses, and it may hold
	// spaces): utime and stime are the 14th and 15th fields of the line.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 || i+2 > len(data) {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(data[i+2:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the command name", pid, len(f))
	}
	ut, err := strconv.ParseFloat(f[11], 64)
	if err != nil {
		return 0, err
	}
	st, err := strconv.ParseFloat(f[12], 64)
	if err != nil {
		return 0, err
	}
	return (ut + st) / 100, nil // clock ticks at USER_HZ 100
}

//go:build unix

package queuebench

import (
	"syscall"
	"time"
)

// processCPU returns the CPU time (user and system) this process has used
// so far, or -1 if it cannot be read.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

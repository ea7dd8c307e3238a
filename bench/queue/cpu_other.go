//go:build !unix

package queuebench

import "time"

// processCPU returns -1: process CPU time is read only on unix systems.
func processCPU() time.Duration { return -1 }

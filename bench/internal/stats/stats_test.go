package stats

import (
	"os"
	"runtime"
	"testing"
	"time"
)

func TestPercentileIsNearestRank(t *testing.T) {
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i + 1)
	}
	for _, tc := range []struct {
		name   string
		sorted []time.Duration
		q      float64
		want   time.Duration
	}{
		{"empty", nil, 0.5, 0},
		{"one", []time.Duration{7}, 0.99, 7},
		{"median of 100", hundred, 0.50, 50},
		{"p99 of 100", hundred, 0.99, 99},
		{"p99 of 99 is their max", hundred[:99], 0.99, 99},
		{"p99 of 32 is their max", hundred[:32], 0.99, 32},
		{"max of 100", hundred, 1, 100},
		{"median of odd", []time.Duration{1, 2, 3}, 0.5, 2},
		{"p99 of 3", []time.Duration{1, 2, 3}, 0.99, 3},
	} {
		if got := Percentile(tc.sorted, tc.q); got != tc.want {
			t.Errorf("%s: Percentile(q=%v) = %v, want %v", tc.name, tc.q, got, tc.want)
		}
	}
}

func TestCPUSecondsReadsThisProcess(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	s, err := CPUSeconds(os.Getpid())
	if err != nil || s < 0 {
		t.Fatalf("CPUSeconds(self) = %v, %v", s, err)
	}
	if _, err := CPUSeconds(-1); err == nil {
		t.Fatal("CPUSeconds(-1): no error")
	}
}

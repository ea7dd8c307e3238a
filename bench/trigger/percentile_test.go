package triggerbench

import (
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
		{"max of 100", hundred, 1, 100},
		{"median of odd", []time.Duration{1, 2, 3}, 0.5, 2},
		{"p99 of 3", []time.Duration{1, 2, 3}, 0.99, 3},
	} {
		if got := percentile(tc.sorted, tc.q); got != tc.want {
			t.Errorf("%s: percentile(q=%v) = %v, want %v", tc.name, tc.q, got, tc.want)
		}
	}
}

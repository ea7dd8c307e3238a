package trigger

import (
	"context"
	"log/slog"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// logInterval is how often a [sampler] writes a record of one kind.
const logInterval = 10 * time.Second

// sampler keeps a flood of refused requests from becoming a flood of log
// lines: of the records of one kind (say, "401"), it writes the first of
// every logInterval, with the number it left out since the last one it
// wrote (suppressed). The kinds are a small fixed set (status codes and
// outcomes), so its memory is bounded.
type sampler struct {
	log   *slog.Logger
	mu    sync.Mutex
	kinds map[string]*sampled
}

type sampled struct {
	last    time.Time
	skipped int
}

func newSampler(log *slog.Logger) *sampler { return &sampler{log: log, kinds: map[string]*sampled{}} }

// Log writes the record, or counts it if a record of its kind was written
// less than logInterval ago.
func (s *sampler) Log(ctx context.Context, level slog.Level, kind, msg string, attrs ...slog.Attr) {
	now := time.Now()
	s.mu.Lock()
	k := s.kinds[kind]
	if k == nil {
		k = &sampled{}
		s.kinds[kind] = k
	}
	if !k.last.IsZero() && now.Sub(k.last) < logInterval {
		k.skipped++
		s.mu.Unlock()
		return
	}
	skipped := k.skipped
	k.last, k.skipped = now, 0
	s.mu.Unlock()
	s.log.LogAttrs(ctx, level, msg, append(attrs, slog.Int("suppressed", skipped))...)
}

// apiLevel is the log level of a failed API call: an error when someone
// has to act (the operator's own permissions, a resource not served), a
// warning for what the caller's retry mends (timeouts, 5xx, a restart).
func apiLevel(err error) slog.Level {
	if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) || apierrors.IsNotFound(err) {
		return slog.LevelError
	}
	return slog.LevelWarn
}

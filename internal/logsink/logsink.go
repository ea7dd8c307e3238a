// Package logsink is the tests' log sink: a buffer that a slog handler
// writes to from any goroutine while the test reads it. It holds no
// goroutines.
package logsink

import (
	"log/slog"
	"strings"
	"sync"
)

// Buffer is what was logged; its methods are safe for concurrent use.
// The zero value is empty and ready.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns everything logged so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Count returns how many times s was logged.
func (b *Buffer) Count(s string) int { return strings.Count(b.String(), s) }

// Lines returns the lines that contain every one of parts.
func (b *Buffer) Lines(parts ...string) []string {
	var out []string
	for _, line := range strings.Split(b.String(), "\n") {
		ok := line != ""
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if ok {
			out = append(out, line)
		}
	}
	return out
}

// Logger returns a logger of text lines into b, at every level.
func (b *Buffer) Logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

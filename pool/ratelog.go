package pool

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Log rate limits: at most logBurst records of one cause (a warning's or
// error's message) per logWindow reach the log; the rest are counted, and
// the next record of that cause that passes says how many were dropped. A
// client sending thousands of bad frames must not fill the disk.
const (
	logBurst  = 10
	logWindow = 10 * time.Second
)

// rateLimited is a slog.Handler that rate-limits warnings and errors per
// message; records below Warn pass untouched. Handlers derived with
// WithAttrs and WithGroup share one set of budgets. Safe for concurrent
// use.
type rateLimited struct {
	next  slog.Handler
	state *logBudgets
}

type logBudgets struct {
	mu      sync.Mutex
	now     func() time.Time
	dropped func() // counts a dropped record; may be nil
	causes  map[string]*logBudget
}

type logBudget struct {
	start   time.Time
	passed  int
	dropped int // since the last record that passed
}

func newRateLimited(next slog.Handler, now func() time.Time, dropped func()) *rateLimited {
	return &rateLimited{next: next, state: &logBudgets{now: now, dropped: dropped, causes: map[string]*logBudget{}}}
}

func (h *rateLimited) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *rateLimited) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		return h.next.Handle(ctx, r)
	}
	s := h.state
	s.mu.Lock()
	b := s.causes[r.Message]
	now := s.now()
	if b == nil {
		b = &logBudget{start: now}
		s.causes[r.Message] = b
	}
	if now.Sub(b.start) >= logWindow {
		b.start, b.passed = now, 0
	}
	if b.passed >= logBurst {
		b.dropped++
		s.mu.Unlock()
		if s.dropped != nil {
			s.dropped()
		}
		return nil
	}
	b.passed++
	dropped := b.dropped
	b.dropped = 0
	s.mu.Unlock()
	if dropped > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int("dropped_before", dropped))
	}
	return h.next.Handle(ctx, r)
}

func (h *rateLimited) WithAttrs(as []slog.Attr) slog.Handler {
	return &rateLimited{next: h.next.WithAttrs(as), state: h.state}
}

func (h *rateLimited) WithGroup(name string) slog.Handler {
	return &rateLimited{next: h.next.WithGroup(name), state: h.state}
}

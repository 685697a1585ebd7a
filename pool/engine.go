package pool

import (
	"math"
	"sync"
	"time"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/metadata"
	"github.com/kvpool/kvpool/pool/store"
	"github.com/kvpool/kvpool/transfer/cost"
)

// engineLoad is what the node's engine last reported (ReportLoad), and the
// load the node plans with and gossips: that report plus the store's use.
// Safe for concurrent use.
type engineLoad struct {
	profiles *cost.Profiles
	now      func() time.Time
	store    interface{ Stats() store.Stats }
	// refresh, when set, gossips a new report at once.
	refresh func()

	mu   sync.Mutex
	last metadata.Load
}

// Report validates and records an engine's report.
func (e *engineLoad) Report(queueSeconds, tps float64, promptTokens uint64, model string) error {
	if queueSeconds < 0 || tps < 0 || math.IsNaN(queueSeconds) || math.IsNaN(tps) || math.IsInf(queueSeconds, 0) || math.IsInf(tps, 0) {
		return api.Errorf(api.ErrInvalidArgument, "pool: queue %v s and prefill %v tokens/s must be non-negative numbers", queueSeconds, tps)
	}
	if promptTokens > 1<<40 {
		return api.Errorf(api.ErrInvalidArgument, "pool: prefill prompt tokens %d is implausible", promptTokens)
	}
	if model != "" {
		if _, err := e.profiles.Model(model); err != nil {
			return api.Errorf(api.ErrInvalidArgument, "pool: report load: %v", err)
		}
	}
	e.mu.Lock()
	now := e.now()
	e.last.QueueSeconds, e.last.PrefillTokensPerSecond = queueSeconds, tps
	e.last.EngineReportUnix, e.last.EngineReportUnixMilli = now.Unix(), now.UnixMilli()
	e.last.PrefillPromptTokens, e.last.Model = int64(promptTokens), model
	e.mu.Unlock()
	if e.refresh != nil {
		e.refresh()
	}
	return nil
}

// load is the node's load: its store's usage and its engine's last report.
func (e *engineLoad) load() metadata.Load {
	st := e.store.Stats()
	e.mu.Lock()
	l := e.last
	e.mu.Unlock()
	l.CapacityBytes, l.UsedBytes, l.Blocks = int64(st.CapacityBytes), int64(st.UsedBytes), int64(st.Blocks)
	return l
}

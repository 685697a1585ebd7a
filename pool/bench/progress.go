package bench

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Progress draws a progress bar for each phase of a run. On a terminal it
// redraws one line in place; otherwise it prints one line per phase. A nil
// *Progress draws nothing.
type Progress struct {
	W        io.Writer
	Terminal bool
	mu       sync.Mutex
}

// Run draws phase until the returned stop is called, showing elapsed time
// against d and the throughput of the bytes counted in total.
func (p *Progress) Run(phase string, d time.Duration, total *atomic.Int64) (stop func()) {
	if p == nil {
		return func() {}
	}
	start := time.Now()
	done := make(chan struct{})
	var wg sync.WaitGroup
	if p.Terminal {
		wg.Go(func() {
			t := time.NewTicker(200 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-done:
					return
				case <-t.C:
					el := time.Since(start)
					p.Phase(phase, el.Seconds()/d.Seconds(), gbps(total.Load(), el))
				}
			}
		})
	}
	return func() {
		close(done)
		wg.Wait()
		el := time.Since(start)
		p.Phase(phase, 1, gbps(total.Load(), el))
		p.mu.Lock()
		fmt.Fprintln(p.W)
		p.mu.Unlock()
	}
}

func gbps(b int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(b) / d.Seconds() / 1e9
}

// Phase draws one state of the bar: frac of the phase done, at rate GB/s
// (0 hides the rate). Off a terminal only the final state is drawn.
func (p *Progress) Phase(phase string, frac, rate float64) {
	if p == nil || (!p.Terminal && frac < 1) {
		return
	}
	frac = min(max(frac, 0), 1)
	const width = 30
	fill := int(frac * width)
	bar := strings.Repeat("=", fill) + strings.Repeat(" ", width-fill)
	line := fmt.Sprintf("%-18s [%s] %3.0f%%", phase, bar, frac*100)
	if rate > 0 {
		line += fmt.Sprintf("  %6.2f GB/s", rate)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.Terminal {
		fmt.Fprintf(p.W, "\r%s", line)
	} else if phase != "populate" || frac >= 1 {
		fmt.Fprint(p.W, line)
		if phase == "populate" {
			fmt.Fprintln(p.W)
		}
	}
}

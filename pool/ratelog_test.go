package pool

import (
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/kvpool/kvpool/internal/eventually"
)

func TestRateLimitedLogs(t *testing.T) {
	logs := &logStore{}
	now := time.Unix(1000, 0)
	dropped := 0
	log := slog.New(newRateLimited(recorder{store: logs}, func() time.Time { return now }, func() { dropped++ })).With("node", "n")
	count := func(msg string) (n int, last map[string]string) {
		logs.mu.Lock()
		defer logs.mu.Unlock()
		for _, r := range logs.records {
			if r["msg"] == msg {
				n, last = n+1, r
			}
		}
		return n, last
	}
	for range 25 {
		log.Warn("bad frame", "remote", "x")
		log.Info("progress")
	}
	log.Error("other cause")
	if n, _ := count("bad frame"); n != logBurst {
		t.Fatalf("%d of 25 warnings of one cause logged, want %d", n, logBurst)
	}
	if n, _ := count("progress"); n != 25 {
		t.Fatalf("%d of 25 info records logged, want all", n)
	}
	if n, _ := count("other cause"); n != 1 || dropped != 15 {
		t.Fatalf("another cause: %d logged; %d dropped in all, want 1 and 15", n, dropped)
	}
	now = now.Add(logWindow)
	log.With("component", "c").Warn("bad frame")
	n, last := count("bad frame")
	if n != logBurst+1 || last["dropped_before"] != "15" || last["node"] != "n" || last["component"] != "c" {
		t.Fatalf("the first record of a new window: %d logged, last %v; want it to say 15 were dropped", n, last)
	}
}

// A node fed garbage logs a few lines per cause and counts the rest.
func TestNodeLogsAreRateLimited(t *testing.T) {
	logs := &logStore{}
	n := startNode(t, func(c *Config) { c.Logger = slog.New(recorder{store: logs}) })
	const frames = 40
	for range frames {
		c, err := net.Dial("tcp", n.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("KVPD\x01\x00\x00\x00\xff garbage that is no frame at all........"))
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.Copy(io.Discard, c); err != nil {
			t.Fatalf("the node kept a connection that sent garbage: %v", err)
		}
		c.Close()
	}
	eventually.True(t, "every dropped warning to be counted", 10*time.Second, func() bool {
		return gathered(t, n, "kvpool_log_dropped_records_total") == frames-logBurst
	})
	logs.mu.Lock()
	defer logs.mu.Unlock()
	got := 0
	for _, r := range logs.records {
		if r["msg"] == "closing data connection after a malformed frame" {
			got++
		}
	}
	if got != logBurst {
		t.Fatalf("%d warnings for %d malformed frames, want %d", got, frames, logBurst)
	}
}

// gathered is the value of the node's counter name, 0 if it has none.
func gathered(t *testing.T, n *Node, name string) float64 {
	t.Helper()
	mfs, err := n.cfg.Gatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

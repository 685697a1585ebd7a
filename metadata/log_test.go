package metadata

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/kvpool/kvpool/internal/eventually"
)

// logBuffer collects log lines from several goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// lines returns the lines that contain substr.
func (b *logBuffer) lines(substr string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for l := range strings.Lines(b.buf.String()) {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return out
}

// TestLogsAreScopedOnce checks the logging contract of every component: the
// caller's logger carries the node's id, the component adds its name, and
// neither appears twice. memberlist's own lines come through the same
// logger, not the process's stderr.
func TestLogsAreScopedOnce(t *testing.T) {
	var buf logBuffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})).With("node", "node-a")

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	g, err := NewGossip(GossipConfig{NodeID: "node-a", Seeds: func() []string { return []string{closed} }, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); g.Run(ctx) }()
	defer func() { cancel(); <-done }()

	e := startEtcd(t)
	cli := newClient(t, e.ClientURL())
	startMember(t, cli, "node-a", func(c *MemberConfig) { c.Logger = log })
	mm := startMirror(t, cli, func(c *MirrorConfig) { c.Logger = log })
	if _, err := cli.Put(context.Background(), "/kvpool/nodes/x", "{"); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct{ component, msg string }{
		{"gossip", `msg="memberlist: failed to join ` + closed},
		{"member", "msg=registered"},
		{"mirror", `msg="skipping a malformed record"`},
	} {
		t.Run(tc.component, func(t *testing.T) {
			eventually.True(t, tc.msg, patience, func() bool { return len(buf.lines(tc.msg)) > 0 })
			line := buf.lines(tc.msg)[0]
			if n := strings.Count(line, " node="); n != 1 || !strings.Contains(line, " node=node-a") {
				t.Errorf("want the caller's node=node-a once, got %d node keys: %s", n, line)
			}
			if n := strings.Count(line, " component="); n != 1 || !strings.Contains(line, " component="+tc.component) {
				t.Errorf("want component=%s once, got %d component keys: %s", tc.component, n, line)
			}
		})
	}
	if got := mm.Stats().Malformed; got != 1 {
		t.Errorf("mirror skipped %d records, want 1", got)
	}
}

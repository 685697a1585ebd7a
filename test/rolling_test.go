package test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvpool/kvpool/test/rolling"
)

// TestRollingRestart drains a node of a three-daemon cluster (separate
// processes, Debian's etcd), then restarts each daemon in turn with
// SIGTERM and --drain-on-stop under a put and get load: no block a put
// acknowledged is lost, whether leased, replicated or neither, the
// clients see failures only as retries on another node, and every drain
// hands off all it held alone. test/rollingbench runs the same at full
// size.
func TestRollingRestart(t *testing.T) {
	var log strings.Builder
	rep, err := rolling.Run(context.Background(), rolling.Config{
		Kvpool: kvpoolBin(t), Etcd: requireTool(t, "etcd"), Dir: t.TempDir(),
		CapacityBytes: 512 << 20, DrainBytes: 32 << 20, DrainBlockBytes: 512 << 10,
		LoadBlockBytes: 64 << 10, Workers: 2, Preload: 64, Settle: 500 * time.Millisecond, DrainBudget: 30 * time.Second,
		Log: &log,
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	if d := rep.Drain; d.Report.Blocks != 64 || d.Report.HandedOffBlocks != 64 || d.Report.KeptBlocks != 0 || d.Lost != 0 {
		t.Errorf("drain: %+v", d)
	}
	r := rep.Rolling
	if r.Errors != 0 || r.LostLeased+r.LostReplicated+r.LostOther != 0 || r.Replicated == 0 || r.Leased == 0 || r.Gets == 0 {
		t.Errorf("rolling restart: %+v", r)
	}
	if len(rep.Nodes) != 3 {
		t.Fatalf("restarts: %+v", rep.Nodes)
	}
	for _, n := range rep.Nodes {
		if n.Kept != 0 || n.HandedOff+n.Replicated == 0 {
			t.Errorf("%s's drain: %+v", n.Node, n)
		}
	}
	t.Logf("drain: %+v\nrolling: %+v\nrestarts: %+v", rep.Drain.Report, r, rep.Nodes)
	if t.Failed() {
		t.Logf("the run's log:\n%s", log.String())
	}
}

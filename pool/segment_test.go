package pool

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A segment file left by a node that died (kill -9 leaves it, and its lock
// file, behind) does not stop the next node from starting; a file whose
// node is alive does.
func TestSegmentFileOwnership(t *testing.T) {
	path := filepath.Join(t.TempDir(), "arena")
	if err := os.WriteFile(path, []byte("left by a dead node"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+".lock", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	n := startNode(t, func(c *Config) { c.SegmentPath = path })
	if fi, err := os.Stat(path); err != nil || fi.Size() != n.cfg.CapacityBytes {
		t.Fatalf("segment file after start: %v, %v; want %d bytes", fi, err, n.cfg.CapacityBytes)
	}
	cfg := TestConfig("second", 4<<20)
	cfg.SegmentPath, cfg.DisableShm = path, true
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "belongs to a running node") {
		t.Fatalf("a second node on a live node's segment file: %v, want refused", err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path, path + ".lock"} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s after a clean close: %v, want it removed", p, err)
		}
	}
}

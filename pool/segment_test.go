package pool

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
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

// A prefaulted segment has every page allocated when it opens, and a
// plain one none (its pages come with their first write).
func TestPrefaultAllocatesTheArena(t *testing.T) {
	const size = 8 << 20
	for _, prefault := range []bool{false, true} {
		s, err := openSegment("prefault-test", "", size, false, prefault)
		if err != nil {
			t.Fatal(err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(int(s.file.Fd()), &st); err != nil {
			t.Fatal(err)
		}
		allocated := st.Blocks * 512
		if (prefault && allocated < size) || (!prefault && allocated != 0) {
			t.Errorf("prefault %v: %d of %d bytes allocated", prefault, allocated, size)
		}
		s.close()
	}
}

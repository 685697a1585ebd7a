package pool

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/internal/hugepages"
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
		s, err := openSegment("prefault-test", "", size, false, prefault, false)
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

// needFreeHugePages returns the system's huge page size when at least
// bytes of them are free, or skips the test; where .ci/run reserved them
// (KVPOOL_HUGETLBFS is set), their lack fails it instead.
func needFreeHugePages(t *testing.T, bytes int64) int64 {
	t.Helper()
	free, size := hugepages.Free()
	if size == 0 || free*size < bytes {
		skip := t.Skipf
		if os.Getenv("KVPOOL_HUGETLBFS") != "" {
			skip = t.Fatalf
		}
		skip("%d free huge pages of %d bytes, want %d bytes (echo 64 > /proc/sys/vm/nr_hugepages)", free, size, bytes)
	}
	return size
}

// An arena of huge pages without a mount (HugePages: a memfd with
// MFD_HUGETLB) is one, serves same-host and TCP clients, must be a whole
// number of huge pages, and is refused with a segment file.
func TestHugePageMemfdArena(t *testing.T) {
	huge := needFreeHugePages(t, 8<<20)
	n := startNode(t, func(c *Config) { c.CapacityBytes, c.MaxBlockBytes, c.HugePages, c.Prefault = 8<<20, 1<<20, true, true })
	if got, err := n.seg.hugePageBytes(); err != nil || got != huge {
		t.Fatalf("the arena's huge page size: %d, %v; want %d", got, err, huge)
	}
	blocks := putBlocks(t, n, api.PathShm, "shm", 5)
	for k, v := range putBlocks(t, n, api.PathData, "data", 5) {
		blocks[k] = v
	}
	checkBlocks(t, n, blocks)

	cfg := TestConfig("huge", huge+huge/2)
	cfg.HugePages = true
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "must be a multiple of") {
		t.Fatalf("a capacity of a page and a half: %v, want a capacity error", err)
	}
	cfg = TestConfig("huge", huge)
	cfg.HugePages, cfg.SegmentPath = true, filepath.Join(t.TempDir(), "arena")
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "huge pages back a memfd arena") {
		t.Fatalf("huge pages with a segment file: %v, want it refused", err)
	}
}

package pool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/internal/hugepages"
)

// persistentNode is a node over a data directory that a test stops and
// starts again.
type persistentNode struct {
	t      *testing.T
	cfg    Config
	n      *Node
	cancel context.CancelFunc
	done   chan error
}

func newPersistentNode(t *testing.T, mutate ...func(*Config)) *persistentNode {
	cfg := TestConfig(fmt.Sprintf("p%d", rand.Uint32()), 16<<20)
	cfg.ShmSocket = filepath.Join(t.TempDir(), "shm.sock")
	cfg.DataDir = filepath.Join(t.TempDir(), "data")
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	for _, m := range mutate {
		m(&cfg)
	}
	p := &persistentNode{t: t, cfg: cfg}
	t.Cleanup(func() {
		p.stop()
		// The segment outlives its node on purpose: remove it by hand.
		os.Remove(p.segmentPath())
	})
	return p
}

func (p *persistentNode) segmentPath() string {
	if p.cfg.SegmentPath != "" {
		return p.cfg.SegmentPath
	}
	c := p.cfg
	c.fillDefaults()
	return c.SegmentPath
}

// start starts the node, or returns New's error.
func (p *persistentNode) start() (*Node, error) {
	cfg := p.cfg
	cfg.Registerer, cfg.Gatherer = nil, nil // a registry per start, as per process
	n, err := New(cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.n, p.cancel, p.done = n, cancel, make(chan error, 1)
	go func() { p.done <- n.Run(ctx) }()
	<-n.Ready()
	return n, nil
}

func (p *persistentNode) mustStart() *Node {
	p.t.Helper()
	n, err := p.start()
	if err != nil {
		p.t.Fatal(err)
	}
	return n
}

// stop shuts the node down cleanly, as SIGTERM does.
func (p *persistentNode) stop() {
	if p.n == nil {
		return
	}
	p.cancel()
	if err := <-p.done; err != nil {
		p.t.Errorf("node run: %v", err)
	}
	if err := p.n.Store().Check(); err != nil {
		p.t.Errorf("store inconsistent at the end: %v", err)
	}
	if err := p.n.Close(); err != nil {
		p.t.Errorf("close: %v", err)
	}
	p.n = nil
}

func putBlocks(t *testing.T, n *Node, path api.Path, ns string, count int) map[string][]byte {
	t.Helper()
	c := dial(t, n, path)
	out := map[string][]byte{}
	for i := range count {
		k := api.BlockKey{Tenant: "t", Namespace: ns, Key: fmt.Appendf(nil, "k%03d", i)}
		v := value(uint64(i)+uint64(len(ns))<<32, 1000+i*3001)
		if err := c.Put(context.Background(), k, v); err != nil {
			t.Fatal(err)
		}
		out[ns+"/"+string(k.Key)] = v
	}
	return out
}

func checkBlocks(t *testing.T, n *Node, want map[string][]byte) {
	t.Helper()
	c := dial(t, n, api.PathData)
	buf := make([]byte, 1<<20)
	for name, v := range want {
		ns, key, _ := strings.Cut(name, "/")
		m, err := c.Get(context.Background(), api.BlockKey{Tenant: "t", Namespace: ns, Key: []byte(key)}, buf)
		if err != nil {
			t.Fatalf("%s after the restart: %v", name, err)
		}
		if !bytes.Equal(buf[:m], v) {
			t.Fatalf("%s after the restart: bytes differ", name)
		}
	}
}

// A node stopped cleanly and started again with the same data directory
// serves every block it held, and none it had removed.
func TestRestartKeepsTheArena(t *testing.T) {
	p := newPersistentNode(t)
	n := p.mustStart()
	if r := n.persist.started; !r.Fresh {
		t.Fatalf("first start: %+v, want fresh", r)
	}
	blocks := putBlocks(t, n, api.PathShm, "shm", 20)
	for k, v := range putBlocks(t, n, api.PathData, "data", 20) {
		blocks[k] = v
	}
	c := dial(t, n, api.PathData)
	removed := []string{"shm/k003", "data/k007"}
	for _, name := range removed {
		ns, key, _ := strings.Cut(name, "/")
		if err := c.Remove(context.Background(), api.BlockKey{Tenant: "t", Namespace: ns, Key: []byte(key)}); err != nil {
			t.Fatal(err)
		}
		delete(blocks, name)
	}
	before := n.Store().Stats()
	p.stop()

	n = p.mustStart()
	r := n.persist.started
	if r.Fresh || r.Adopted != len(blocks) || r.AdoptedBytes != int64(before.StoredBytes) || r.Dropped != 0 || r.TornJournalBytes != 0 {
		t.Fatalf("restart: %+v; want %d adopted of %d bytes, nothing dropped or torn", r, len(blocks), before.StoredBytes)
	}
	// Used less reserved: same-host writers hold a spare reservation.
	if after := n.Store().Stats(); after.Blocks != before.Blocks || after.StoredBytes != before.StoredBytes || after.UsedBytes-after.ReservedBytes != before.UsedBytes-before.ReservedBytes {
		t.Fatalf("restart: %d blocks, %d bytes stored, %d used by blocks; before %d, %d, %d",
			after.Blocks, after.StoredBytes, after.UsedBytes-after.ReservedBytes, before.Blocks, before.StoredBytes, before.UsedBytes-before.ReservedBytes)
	}
	checkBlocks(t, n, blocks)
	buf := make([]byte, 1<<20)
	for _, name := range removed {
		ns, key, _ := strings.Cut(name, "/")
		if _, err := dial(t, n, api.PathData).Get(context.Background(), api.BlockKey{Tenant: "t", Namespace: ns, Key: []byte(key)}, buf); !errors.Is(err, api.ErrNotFound) {
			t.Fatalf("removed block %s after the restart: %v", name, err)
		}
	}
	// Same-host clients of the new node read the adopted blocks through
	// their mapping, and puts go around them.
	for k, v := range putBlocks(t, n, api.PathShm, "more", 10) {
		blocks[k] = v
	}
	checkBlocks(t, n, blocks)
	p.stop()
	n = p.mustStart()
	if r := n.persist.started; r.Adopted != len(blocks) {
		t.Fatalf("second restart adopted %d blocks, want %d", r.Adopted, len(blocks))
	}
	checkBlocks(t, n, blocks)
}

// Bytes that changed under a journaled block (a crash mid-overwrite) and
// a torn journal tail (a crash mid-flush) cost that block, never a wrong
// answer.
func TestRestartDropsBlocksThatFailTheirChecksum(t *testing.T) {
	p := newPersistentNode(t)
	n := p.mustStart()
	blocks := putBlocks(t, n, api.PathData, "ns", 10)
	pin, err := n.Store().Acquire([]byte("t"), []byte("ns"), []byte("k004"))
	if err != nil {
		t.Fatal(err)
	}
	offset := pin.Offset
	n.Store().Release(pin)
	p.stop()

	seg, err := os.OpenFile(p.segmentPath(), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := seg.WriteAt([]byte{0xff, 0x00, 0xff}, offset+100); err != nil {
		t.Fatal(err)
	}
	seg.Close()
	jf, err := os.OpenFile(filepath.Join(p.cfg.DataDir, journalName), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	jf.Write([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9})
	jf.Close()

	n = p.mustStart()
	r := n.persist.started
	if r.Adopted != 9 || r.Dropped != 1 || r.TornJournalBytes != 9 {
		t.Fatalf("restart: %+v; want 9 adopted, 1 dropped, 9 torn bytes", r)
	}
	if got := restoredMetric(t, n, "dropped"); got != 1 {
		t.Fatalf("kvpool_persist_restored_blocks{outcome=dropped} = %v, want 1", got)
	}
	if got := restoredMetric(t, n, "adopted"); got != 9 {
		t.Fatalf("kvpool_persist_restored_blocks{outcome=adopted} = %v, want 9", got)
	}
	delete(blocks, "ns/k004")
	checkBlocks(t, n, blocks)
	if _, err := dial(t, n, api.PathData).Get(context.Background(), api.BlockKey{Tenant: "t", Namespace: "ns", Key: []byte("k004")}, make([]byte, 1<<20)); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("the damaged block after the restart: %v, want NotFound", err)
	}
	p.stop()
	// The journal was rewritten without the torn tail and the dropped block.
	n = p.mustStart()
	if r := n.persist.started; r.Adopted != 9 || r.Dropped != 0 || r.TornJournalBytes != 0 {
		t.Fatalf("second restart: %+v; want 9 adopted, nothing dropped or torn", r)
	}
}

func TestRestartRefusesAnotherLayout(t *testing.T) {
	p := newPersistentNode(t)
	n := p.mustStart()
	putBlocks(t, n, api.PathData, "ns", 3)
	p.stop()

	p.cfg.CapacityBytes = 32 << 20
	if _, err := p.start(); err == nil || !strings.Contains(err.Error(), "--fresh") || !strings.Contains(err.Error(), "--capacity") {
		t.Fatalf("restart with another capacity: %v; want an error naming --capacity and --fresh", err)
	}
	p.cfg.Fresh = true
	n = p.mustStart()
	if r := n.persist.started; !r.Fresh || n.Store().Stats().Blocks != 0 {
		t.Fatalf("--fresh: %+v, %d blocks; want an empty start", r, n.Store().Stats().Blocks)
	}
	blocks := putBlocks(t, n, api.PathData, "ns2", 3)
	p.stop()
	p.cfg.Fresh = false
	n = p.mustStart()
	checkBlocks(t, n, blocks)
}

// A host reboot empties /dev/shm but keeps the data directory: the node
// starts empty instead of refusing to start.
func TestRestartAfterTheSegmentIsGone(t *testing.T) {
	p := newPersistentNode(t)
	n := p.mustStart()
	putBlocks(t, n, api.PathData, "ns", 3)
	p.stop()
	if err := os.Remove(p.segmentPath()); err != nil {
		t.Fatal(err)
	}
	n = p.mustStart()
	if r := n.persist.started; !r.Fresh || n.Store().Stats().Blocks != 0 {
		t.Fatalf("restart without the segment: %+v, %d blocks; want an empty start", r, n.Store().Stats().Blocks)
	}
}

// A running node owns its segment: a second node on the same data
// directory is refused.
func TestSecondNodeOnTheSameDataDirFails(t *testing.T) {
	p := newPersistentNode(t)
	p.mustStart()
	cfg := p.cfg
	cfg.ListenAddr = "127.0.0.1:0"
	cfg.ShmSocket = filepath.Join(t.TempDir(), "other.sock")
	if n, err := New(cfg); err == nil {
		n.Close()
		t.Fatal("a second node on the same data directory started")
	} else if !strings.Contains(err.Error(), "running node") {
		t.Fatalf("second node: %v; want it to say a running node holds the segment", err)
	}
}

// restoredMetric is the node's kvpool_persist_restored_blocks of outcome.
func restoredMetric(t *testing.T, n *Node, outcome string) float64 {
	t.Helper()
	mfs, err := n.cfg.Gatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kvpool_persist_restored_blocks" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no kvpool_persist_restored_blocks{outcome=%q}", outcome)
	return 0
}

// Churn past JournalCompactBytes compacts the journal while the node
// serves; the restart after it still adopts exactly the live blocks.
func TestJournalCompactsWhileServing(t *testing.T) {
	p := newPersistentNode(t, func(c *Config) {
		c.JournalCompactBytes = 8 << 10
		c.JournalFlushInterval = time.Millisecond
	})
	n := p.mustStart()
	c := dial(t, n, api.PathData)
	ctx := context.Background()
	live := map[string][]byte{}
	for i := 0; n.persist.compactions.Load() < 3; i++ {
		k := fmt.Appendf(nil, "k%05d", i)
		v := value(uint64(i), 4096)
		if err := c.Put(ctx, api.BlockKey{Tenant: "t", Namespace: "ns", Key: k}, v); err != nil {
			t.Fatal(err)
		}
		live["ns/"+string(k)] = v
		if i >= 10 {
			old := fmt.Sprintf("k%05d", i-10)
			if err := c.Remove(ctx, api.BlockKey{Tenant: "t", Namespace: "ns", Key: []byte(old)}); err != nil {
				t.Fatal(err)
			}
			delete(live, "ns/"+old)
		}
		if i > 100000 {
			t.Fatal("no three compactions in 100,000 puts")
		}
	}
	if size := n.persist.journal.Size(); size > 64<<10 {
		t.Fatalf("journal of %d bytes after compactions (10 live blocks)", size)
	}
	p.stop()
	n = p.mustStart()
	if r := n.persist.started; r.Adopted != len(live) || r.Dropped != 0 {
		t.Fatalf("restart after compactions: %+v; want %d adopted, none dropped", r, len(live))
	}
	checkBlocks(t, n, live)
}

// A same-host client outlives its node's restart: once the node is back
// on the same socket, its next calls attach again, map the segment anew
// and read the blocks the node kept; zero-copy views taken before stay
// readable until closed.
func TestShmClientReattachesAfterRestart(t *testing.T) {
	p := newPersistentNode(t)
	n := p.mustStart()
	p.cfg.ListenAddr = n.Addr().String() // the same address again
	blocks := putBlocks(t, n, api.PathShm, "before", 10)
	c := dial(t, n, api.PathShm)
	k := api.BlockKey{Tenant: "t", Namespace: "before", Key: []byte("k001")}
	view, err := c.View(context.Background(), k)
	if err != nil {
		t.Fatal(err)
	}
	want := blocks["before/k001"]
	p.stop()
	// A block this client has not read needs the node.
	if _, err := c.Get(context.Background(), api.BlockKey{Tenant: "t", Namespace: "before", Key: []byte("k002")}, make([]byte, 1<<20)); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("get with the node down: %v, want Unavailable", err)
	}
	n = p.mustStart()
	buf := make([]byte, 1<<20)
	for name, v := range blocks {
		ns, key, _ := strings.Cut(name, "/")
		var m int
		err := eventuallyNil(func() error {
			var err error
			m, err = c.Get(context.Background(), api.BlockKey{Tenant: "t", Namespace: ns, Key: []byte(key)}, buf)
			return err
		})
		if err != nil || !bytes.Equal(buf[:m], v) {
			t.Fatalf("%s after the restart: %v", name, err)
		}
	}
	if c.Path() != api.PathShm {
		t.Fatalf("path %v after the restart", c.Path())
	}
	v := value(99, 5000)
	nk := api.BlockKey{Tenant: "t", Namespace: "after", Key: []byte("new")}
	if err := c.Put(context.Background(), nk, v); err != nil {
		t.Fatal(err)
	}
	if m, err := dial(t, n, api.PathData).Get(context.Background(), nk, buf); err != nil || !bytes.Equal(buf[:m], v) {
		t.Fatalf("put through the new session: %v", err)
	}
	// The old view's mapping is still there until it is closed.
	if !bytes.Equal(view.Bytes(), want) {
		t.Fatal("a view taken before the restart changed")
	}
	view.Close()
}

// A write-behind put whose session breaks (the node stopped) is reported
// once: by PutAsync when the break came before its commit went out, by
// Flush otherwise, naming its key. Once the node is back, the client's
// next write-behind puts attach again and store, and blocks flushed
// before the stop are still there.
func TestShmWriteBehindAcrossRestart(t *testing.T) {
	p := newPersistentNode(t)
	n := p.mustStart()
	p.cfg.ListenAddr = n.Addr().String() // the same address again
	ctx := context.Background()
	c, err := api.Dial(ctx, api.ClientConfig{Server: n.Addr().String(), Path: api.PathShm, NoLocalServe: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	key := func(name string) api.BlockKey {
		return api.BlockKey{Tenant: "t", Namespace: "behind", Key: []byte(name)}
	}
	if err := c.PutAsync(ctx, key("before"), value(1, 300_000)); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	p.stop()
	reported := 0
	if err := c.PutAsync(ctx, key("down"), value(2, 300_000)); err != nil {
		if !errors.Is(err, api.ErrUnavailable) {
			t.Fatalf("PutAsync with the node down: %v, want Unavailable", err)
		}
		reported++
	}
	if err := c.Flush(ctx); err != nil {
		if !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), key("down").String()) {
			t.Fatalf("Flush with the node down: %v, want Unavailable naming %s", err, key("down"))
		}
		reported++
	}
	if reported != 1 {
		t.Fatalf("the put with the node down was reported %d times, want once", reported)
	}
	n = p.mustStart()
	after := value(3, 300_000)
	if err := eventuallyNil(func() error { return c.PutAsync(ctx, key("after"), after) }); err != nil {
		t.Fatalf("PutAsync after the restart: %v", err)
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatalf("Flush after the restart: %v", err)
	}
	reader := dial(t, n, api.PathData)
	for name, want := range map[string][]byte{"before": value(1, 300_000), "after": after} {
		if got, err := reader.GetValue(ctx, key(name)); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s after the restart: %v", name, err)
		}
	}
}

// eventuallyNil retries f for up to 10 s while it fails with Unavailable
// (a session that broke is attached again at most every 100 ms).
func eventuallyNil(f func() error) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := f()
		if err == nil || !errors.Is(err, api.ErrUnavailable) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// hugetlbfsDir is a fresh directory on a hugetlbfs mount with at least
// bytes of free huge pages, or skips the test. .ci/run reserves pages,
// mounts one and names it in KVPOOL_HUGETLBFS, and then a mount that is
// not usable fails the test instead.
func hugetlbfsDir(t *testing.T, bytes int64) string {
	t.Helper()
	var candidates []string
	required := os.Getenv("KVPOOL_HUGETLBFS")
	if required != "" {
		candidates = []string{required}
	} else if mounts, err := os.ReadFile("/proc/mounts"); err == nil {
		for _, line := range strings.Split(string(mounts), "\n") {
			if f := strings.Fields(line); len(f) >= 3 && f[2] == "hugetlbfs" {
				candidates = append(candidates, f[1])
			}
		}
	}
	skip := t.Skipf
	if required != "" {
		skip = t.Fatalf
	}
	for _, mount := range candidates {
		huge, err := hugePageBytes(filepath.Join(mount, "x"))
		if err != nil || huge == 0 {
			t.Logf("%s is not a hugetlbfs mount (%v)", mount, err)
			continue
		}
		free, _ := hugepages.Free()
		if free*huge < bytes {
			t.Logf("hugetlbfs at %s: %d free pages of %d bytes, want %d bytes", mount, free, huge, bytes)
			continue
		}
		dir, err := os.MkdirTemp(mount, "kvpool-test-")
		if err != nil {
			t.Logf("hugetlbfs at %s: %v", mount, err)
			continue
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	skip("no hugetlbfs mount with %d bytes of free huge pages among %q (mount -t hugetlbfs none DIR; echo 64 > /proc/sys/vm/nr_hugepages)", bytes, candidates)
	return ""
}

// An arena in huge pages (--segment-path on hugetlbfs) survives a
// restart like one under /dev/shm: its trailer takes a whole huge page,
// and same-host clients map it.
func TestRestartKeepsAHugePageArena(t *testing.T) {
	dir := hugetlbfsDir(t, 16<<20+2<<20)
	p := newPersistentNode(t, func(c *Config) { c.SegmentPath = filepath.Join(dir, "arena") })
	n := p.mustStart()
	blocks := putBlocks(t, n, api.PathShm, "shm", 10)
	for k, v := range putBlocks(t, n, api.PathData, "data", 10) {
		blocks[k] = v
	}
	p.stop()
	n = p.mustStart()
	if r := n.persist.started; r.Fresh || r.Adopted != len(blocks) || r.Dropped != 0 {
		t.Fatalf("restart: %+v, want %d adopted", r, len(blocks))
	}
	checkBlocks(t, n, blocks)
	for k, v := range putBlocks(t, n, api.PathShm, "more", 5) {
		blocks[k] = v
	}
	checkBlocks(t, n, blocks)
}

// A capacity that is not a whole number of huge pages is refused with a
// message that says so, and leaves no file behind.
func TestHugePageArenaNeedsWholePages(t *testing.T) {
	dir := hugetlbfsDir(t, 4<<20)
	for _, persistent := range []bool{false, true} {
		cfg := TestConfig("huge", 3<<20)
		cfg.SegmentPath = filepath.Join(dir, fmt.Sprintf("arena-%v", persistent))
		if persistent {
			cfg.DataDir = t.TempDir()
		}
		_, err := New(cfg)
		if err == nil || !strings.Contains(err.Error(), "must be a multiple of") {
			t.Fatalf("persistent %v: New: %v, want a capacity error", persistent, err)
		}
		if _, err := os.Stat(cfg.SegmentPath); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("persistent %v: the segment file stayed: %v", persistent, err)
		}
	}
}

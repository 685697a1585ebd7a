package disk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/eviction"
	"github.com/kvpool/kvpool/internal/eventually"
)

// waitWithin bounds every wait for the writers.
const waitWithin = 20 * time.Second

func testConfig(t *testing.T, dir string) Config {
	return Config{
		Dir:           dir,
		CapacityBytes: 64 << 20,
		Logger:        slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
}

// open opens a tier, closed when the test ends.
func open(t *testing.T, cfg Config) *Tier {
	t.Helper()
	tier, err := Open(cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := tier.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return tier
}

// run starts the tier's writers; the returned stop (also run when the
// test ends, before the tier is closed) cancels them and waits for Run.
func run(t *testing.T, tier *Tier) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- tier.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-errc; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// outcomes is how many accepted offers the writers have finished with:
// each ends written, failed, or skipped at write time. The counters move
// last in a write, after the index, so a count seen means its blocks are
// settled.
func outcomes(s Stats) uint64 {
	n := s.Spilled
	for _, v := range s.WriteFailures {
		n += v
	}
	for _, r := range []string{skipQuota, skipFull, skipExpired, skipRemoved} {
		n += s.Skips[r]
	}
	return n
}

// settle waits until the writers have finished with n offers in all.
func settle(t *testing.T, tier *Tier, n uint64) Stats {
	t.Helper()
	var s Stats
	eventually.True(t, fmt.Sprintf("%d offers written or skipped", n), waitWithin, func() bool {
		s = tier.Stats()
		return outcomes(s) >= n
	})
	if got := outcomes(s); got != n {
		t.Fatalf("%d offers finished, want %d", got, n)
	}
	return s
}

// testBlock is one block a test offers, with its done count.
type testBlock struct {
	tenant, namespace string
	key, data         []byte
	expires           int64
	done              atomic.Int32
}

func newBlock(tenant, key string, size int) *testBlock {
	return &testBlock{tenant: tenant, namespace: "ns", key: []byte(key), data: pattern(size, tenant+key)}
}

// pattern is size deterministic bytes that differ by seed.
func pattern(size int, seed string) []byte {
	b := make([]byte, size)
	fill(b, seed)
	return b
}

func fill(b []byte, seed string) {
	x := uint32(api.Checksum([]byte(seed))) | 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
}

func (b *testBlock) offer(tier *Tier) bool {
	return tier.Offer(b.tenant, b.namespace, b.key, b.data, api.Checksum(b.data), b.expires, func() { b.done.Add(1) })
}

func mustOffer(t *testing.T, tier *Tier, bs ...*testBlock) {
	t.Helper()
	for _, b := range bs {
		if !b.offer(tier) {
			t.Fatalf("offer of %s/%s was declined", b.tenant, b.key)
		}
	}
}

func (b *testBlock) id() string { return blockID(b.tenant, b.namespace, b.key) }

// path is the block's file.
func (b *testBlock) path(dir string) string { return filepath.Join(dir, "blocks", fileName(b.id())) }

func (b *testBlock) read(tier *Tier) ([]byte, error) {
	dst := make([]byte, len(b.data))
	crc, err := tier.Read([]byte(b.tenant), []byte(b.namespace), b.key, dst)
	if err == nil && crc != api.Checksum(b.data) {
		return nil, fmt.Errorf("Read returned CRC %08x, want %08x", crc, api.Checksum(b.data))
	}
	return dst, err
}

// mustRead reads b and checks its bytes.
func mustRead(t *testing.T, tier *Tier, b *testBlock) {
	t.Helper()
	got, err := b.read(tier)
	if err != nil {
		t.Fatalf("Read %s/%s: %v", b.tenant, b.key, err)
	}
	if !bytes.Equal(got, b.data) {
		t.Fatalf("Read %s/%s: the bytes differ from those written", b.tenant, b.key)
	}
}

// mustMiss checks that the tier does not hold b and has no file for it.
func mustMiss(t *testing.T, tier *Tier, b *testBlock) {
	t.Helper()
	if _, ok := tier.Size([]byte(b.tenant), []byte(b.namespace), b.key); ok {
		t.Fatalf("the tier holds %s/%s", b.tenant, b.key)
	}
	if _, err := b.read(tier); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("Read %s/%s: %v, want ErrNotFound", b.tenant, b.key, err)
	}
	for _, p := range []string{b.path(tier.cfg.Dir), b.path(tier.cfg.Dir) + tmpExt} {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("%s/%s has a file %s (%v)", b.tenant, b.key, p, err)
		}
	}
}

func holds(tier *Tier, b *testBlock) bool {
	_, ok := tier.Size([]byte(b.tenant), []byte(b.namespace), b.key)
	return ok
}

// checkDone checks that every block's done ran once.
func checkDone(t *testing.T, bs ...*testBlock) {
	t.Helper()
	for _, b := range bs {
		if n := b.done.Load(); n != 1 {
			t.Errorf("done of %s/%s ran %d times, want once", b.tenant, b.key, n)
		}
	}
}

// blockFiles lists the files under dir/blocks.
func blockFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(filepath.Join(dir, "blocks"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			out = append(out, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// recordingSink records what the tier tells the cluster map.
type recordingSink struct {
	mu             sync.Mutex
	added, removed []string // blockIDs in order
}

func (s *recordingSink) AddedDisk(tenant, namespace, key []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.added = append(s.added, blockID(string(tenant), string(namespace), key))
}

func (s *recordingSink) RemovedDisk(tenant, namespace, key []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.removed = append(s.removed, blockID(string(tenant), string(namespace), key))
}

func (s *recordingSink) lists() (added, removed []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.added), slices.Clone(s.removed)
}

func ids(bs ...*testBlock) []string {
	var out []string
	for _, b := range bs {
		out = append(out, b.id())
	}
	return out
}

// testClock is a settable Config.Now.
type testClock struct{ ns atomic.Int64 }

func newClock() *testClock {
	c := &testClock{}
	c.ns.Store(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *testClock) Now() time.Time           { return time.Unix(0, c.ns.Load()) }
func (c *testClock) Add(d time.Duration)      { c.ns.Add(int64(d)) }
func (c *testClock) At(d time.Duration) int64 { return c.ns.Load() + int64(d) }

func TestRoundTrip(t *testing.T) {
	sizes := []int{1, 4095, 4096, 2<<20 + 7}
	for _, mode := range []IOMode{IODirect, IOBuffered} {
		t.Run(mode.String(), func(t *testing.T) {
			cfg := testConfig(t, t.TempDir())
			cfg.IO = mode
			tier := open(t, cfg)
			if got, want := tier.Direct(), mode == IODirect; got != want || tier.Opened().Direct != want {
				t.Fatalf("Direct() = %v, Opened().Direct = %v; want %v", got, tier.Opened().Direct, want)
			}
			type tc struct {
				name    string
				aligned bool
				b       *testBlock
			}
			var cases []tc
			for _, size := range sizes {
				for _, al := range []bool{true, false} {
					name := fmt.Sprintf("%d/aligned=%v", size, al)
					b := &testBlock{tenant: "t", namespace: "ns", key: []byte(name)}
					if al {
						b.data = alignedBuffer(int(roundUp(int64(size))))[:size]
					} else {
						b.data = make([]byte, size+1)[1:]
					}
					if aligned(b.data) != al {
						t.Fatalf("%s: test data aligned = %v", name, aligned(b.data))
					}
					fill(b.data, name)
					cases = append(cases, tc{name, al, b})
				}
			}
			for _, c := range cases {
				mustOffer(t, tier, c.b)
			}
			if s := tier.Stats(); s.Spilled != 0 || s.PendingBytes == 0 {
				t.Fatalf("before Run: %d spilled, %d bytes pending", s.Spilled, s.PendingBytes)
			}
			run(t, tier)
			s := settle(t, tier, uint64(len(cases)))
			var wantBytes, wantFileBytes int64
			for _, c := range cases {
				wantBytes += int64(len(c.b.data))
				wantFileBytes += fileBytes(int64(len(c.b.data)))
			}
			if s.Spilled != uint64(len(cases)) || s.SpilledBytes != uint64(wantBytes) || s.Blocks != int64(len(cases)) ||
				s.Bytes != wantFileBytes || s.PendingBytes != 0 {
				t.Fatalf("stats %+v: want %d blocks, %d bytes (%d file bytes), none pending", s, len(cases), wantBytes, wantFileBytes)
			}
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					checkDone(t, c.b)
					size := len(c.b.data)
					if n, ok := tier.Size([]byte("t"), []byte("ns"), c.b.key); !ok || n != int64(size) {
						t.Fatalf("Size = %d, %v", n, ok)
					}
					st, err := os.Stat(c.b.path(cfg.Dir))
					if err != nil {
						t.Fatal(err)
					}
					if st.Size() != fileBytes(int64(size)) {
						t.Fatalf("the file has %d bytes, want %d", st.Size(), fileBytes(int64(size)))
					}
					// The reader's buffer as aligned as the writer's:
					// direct and unaligned goes through the bounce
					// buffer both ways.
					var dst []byte
					if c.aligned {
						dst = alignedBuffer(int(roundUp(int64(size))))[:size]
					} else {
						dst = make([]byte, size+1)[1:]
					}
					crc, err := tier.Read([]byte("t"), []byte("ns"), c.b.key, dst)
					if err != nil {
						t.Fatalf("Read: %v", err)
					}
					if crc != api.Checksum(c.b.data) || !bytes.Equal(dst, c.b.data) {
						t.Fatalf("Read returned other bytes (crc %08x, want %08x)", crc, api.Checksum(c.b.data))
					}
					if _, err := tier.Read([]byte("t"), []byte("ns"), c.b.key, make([]byte, size+1)); !errors.Is(err, api.ErrInvalidArgument) {
						t.Fatalf("Read into a buffer of the wrong size: %v, want ErrInvalidArgument", err)
					}
				})
			}
			s = tier.Stats()
			if s.Read != uint64(len(cases)) || s.ReadBytes != uint64(wantBytes) || s.ReadBytesPerSecond <= 0 {
				t.Fatalf("after the reads: %d read, %d bytes, %v B/s", s.Read, s.ReadBytes, s.ReadBytesPerSecond)
			}
			got, err := tier.Exists([]byte("t"), []byte("ns"), [][]byte{cases[0].b.key, []byte("absent")})
			if err != nil || !slices.Equal(got, []bool{true, false}) {
				t.Fatalf("Exists = %v, %v", got, err)
			}
		})
	}
}

func TestOfferDone(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.MaxBlockBytes = 64 << 10
	tier := open(t, cfg)
	tier.SetTenant("small", &eviction.TenantConfig{DiskQuotaBytes: fileBytes(1)})

	a := newBlock("t", "a", 100)
	mustOffer(t, tier, a)
	dup := newBlock("t", "a", 100)
	if dup.offer(tier) {
		t.Fatal("a second offer of a queued block was accepted")
	}
	empty := newBlock("t", "empty", 0)
	large := newBlock("t", "large", int(cfg.MaxBlockBytes)+1)
	for _, b := range []*testBlock{empty, large} {
		if b.offer(tier) {
			t.Fatalf("offer of %d bytes was accepted", len(b.data))
		}
	}
	if n := tier.Stats().Skips[skipTooLarge]; n != 2 {
		t.Fatalf("skips[too_large] = %d, want 2", n)
	}
	// Accepted, then skipped at write time: done still runs.
	overQuota := newBlock("small", "q", align+1)
	mustOffer(t, tier, overQuota)

	run(t, tier)
	s := settle(t, tier, 2)
	if s.Spilled != 1 || s.Skips[skipQuota] != 1 {
		t.Fatalf("%d spilled, skips %v: want 1 spilled, 1 over quota", s.Spilled, s.Skips)
	}
	mustRead(t, tier, a)
	mustMiss(t, tier, overQuota)
	again := newBlock("t", "a", 100)
	if again.offer(tier) {
		t.Fatal("an offer of a block the tier holds was accepted")
	}
	checkDone(t, a, overQuota)
	for _, b := range []*testBlock{dup, empty, large, again} {
		if n := b.done.Load(); n != 0 {
			t.Errorf("done of declined %s ran %d times", b.key, n)
		}
	}
}

// TestRunAbandons: blocks still queued when Run's context ends are
// dropped, each done called once, and may be offered again.
func TestRunAbandons(t *testing.T) {
	tier := open(t, testConfig(t, t.TempDir()))
	var bs []*testBlock
	for i := range 20 {
		b := newBlock("t", fmt.Sprint(i), 5000)
		mustOffer(t, tier, b)
		bs = append(bs, b)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := tier.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	checkDone(t, bs...)
	if s := tier.Stats(); s.PendingBytes != 0 || s.Blocks != int64(s.Spilled) {
		t.Fatalf("after Run: %d bytes pending, %d blocks, %d spilled", s.PendingBytes, s.Blocks, s.Spilled)
	}
	var requeued []*testBlock
	for _, b := range bs {
		if holds(tier, b) {
			continue // a writer took it before it saw the end
		}
		mustMiss(t, tier, b)
		b.done.Store(0)
		// Nothing writes until Run runs again: declined, done not called.
		if b.offer(tier) || b.done.Load() != 0 {
			t.Fatalf("offer of %s/%s accepted after Run returned", b.tenant, b.key)
		}
		requeued = append(requeued, b)
	}
	run(t, tier)
	eventually.True(t, "Run running again", waitWithin, func() bool {
		tier.mu.Lock()
		defer tier.mu.Unlock()
		return !tier.mu.stopped
	})
	mustOffer(t, tier, requeued...)
	settle(t, tier, uint64(len(bs)))
	checkDone(t, requeued...)
	for _, b := range bs {
		mustRead(t, tier, b)
	}
}

func TestMaxPendingBytes(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	const size = 10000
	cfg.MaxPendingBytes = 3 * size
	tier := open(t, cfg)
	var bs []*testBlock
	for i := range 3 {
		b := newBlock("t", fmt.Sprint(i), size)
		mustOffer(t, tier, b)
		bs = append(bs, b)
	}
	over := newBlock("t", "over", size)
	if over.offer(tier) {
		t.Fatal("an offer past MaxPendingBytes was accepted")
	}
	s := tier.Stats()
	if s.Skips[skipQueueFull] != 1 || s.PendingBytes != 3*size {
		t.Fatalf("skips %v, %d bytes pending: want 1 queue_full, %d pending", s.Skips, s.PendingBytes, 3*size)
	}
	run(t, tier)
	if s := settle(t, tier, 3); s.PendingBytes != 0 {
		t.Fatalf("%d bytes pending after the writes", s.PendingBytes)
	}
	checkDone(t, bs...)
	if n := over.done.Load(); n != 0 {
		t.Fatalf("done of the declined offer ran %d times", n)
	}
	mustMiss(t, tier, over)
	mustOffer(t, tier, over) // room again
	settle(t, tier, 4)
	mustRead(t, tier, over)
}

// writeBlocks opens a tier in cfg.Dir, writes bs and closes it.
func writeBlocks(t *testing.T, cfg Config, bs ...*testBlock) Stats {
	t.Helper()
	tier, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer tier.Close()
	mustOffer(t, tier, bs...)
	stop := run(t, tier)
	s := settle(t, tier, uint64(len(bs)))
	stop()
	if s.Spilled != uint64(len(bs)) {
		t.Fatalf("%d of %d blocks written", s.Spilled, len(bs))
	}
	return s
}

func TestReopenRebuildsIndex(t *testing.T) {
	clock := newClock()
	cfg := testConfig(t, t.TempDir())
	cfg.Now = clock.Now
	var bs []*testBlock
	for i := range 12 {
		b := newBlock([]string{"a", "b", "c"}[i%3], fmt.Sprint(i), 1000*i+1)
		if i%2 == 0 {
			b.expires = clock.At(time.Hour)
		}
		bs = append(bs, b)
	}
	before := writeBlocks(t, cfg, bs...)

	tier := open(t, cfg)
	r := tier.Opened()
	if r.Blocks != len(bs) || r.Bytes != before.Bytes || r.Dropped+r.Expired+r.Evicted+r.Partial != 0 {
		t.Fatalf("Opened() = %+v, want %d blocks, %d bytes, nothing dropped", r, len(bs), before.Bytes)
	}
	if s := tier.Stats(); s.Blocks != before.Blocks || s.Bytes != before.Bytes {
		t.Fatalf("after reopening %d blocks, %d bytes; before %d, %d", s.Blocks, s.Bytes, before.Blocks, before.Bytes)
	}
	for _, b := range bs {
		mustRead(t, tier, b)
	}
	// The TTLs came back from the headers.
	clock.Add(2 * time.Hour)
	for i, b := range bs {
		if got, want := holds(tier, b), i%2 == 1; got != want {
			t.Fatalf("block %d: held %v two hours on, want %v", i, got, want)
		}
	}
	if n := tier.Sweep(clock.Now()); n != len(bs)/2 {
		t.Fatalf("Sweep = %d, want %d", n, len(bs)/2)
	}
}

func TestReopenDropsWhatItCannotTrust(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	badMagic, short, good, moved := newBlock("t", "bad-magic", 5000), newBlock("t", "short", 9000), newBlock("t", "good", 3000), newBlock("t", "moved", 3000)
	writeBlocks(t, cfg, badMagic, short, good, moved)

	f, err := os.OpenFile(badMagic.path(cfg.Dir), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("X"), 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Truncate(short.path(cfg.Dir), headerBytes+100); err != nil {
		t.Fatal(err)
	}
	// A whole block file under another block's name.
	elsewhere := newBlock("t", "elsewhere", 3000)
	if err := os.Rename(moved.path(cfg.Dir), elsewhere.path(cfg.Dir)); err != nil {
		t.Fatal(err)
	}
	// A write a stop cut short.
	tmp := good.path(cfg.Dir) + tmpExt
	if err := os.WriteFile(tmp, []byte("partial"), 0o600); err != nil {
		t.Fatal(err)
	}

	tier := open(t, cfg)
	r := tier.Opened()
	if r.Blocks != 1 || r.Dropped != 3 || r.Partial != 1 || r.Expired != 0 || r.Evicted != 0 {
		t.Fatalf("Opened() = %+v, want 1 block, 3 dropped, 1 partial", r)
	}
	mustRead(t, tier, good)
	for _, b := range []*testBlock{badMagic, short, moved, elsewhere} {
		mustMiss(t, tier, b)
	}
	if files := blockFiles(t, cfg.Dir); len(files) != 1 || files[0] != good.path(cfg.Dir) {
		t.Fatalf("files left: %v, want only %s", files, good.path(cfg.Dir))
	}
}

func TestReopenDropsExpired(t *testing.T) {
	clock := newClock()
	cfg := testConfig(t, t.TempDir())
	cfg.Now = clock.Now
	soon, later, never := newBlock("t", "soon", 100), newBlock("t", "later", 100), newBlock("t", "never", 100)
	soon.expires, later.expires = clock.At(time.Minute), clock.At(time.Hour)
	writeBlocks(t, cfg, soon, later, never)

	clock.Add(time.Minute) // a TTL that ends now has ended
	tier := open(t, cfg)
	if r := tier.Opened(); r.Blocks != 2 || r.Expired != 1 {
		t.Fatalf("Opened() = %+v, want 2 blocks, 1 expired", r)
	}
	mustMiss(t, tier, soon)
	mustRead(t, tier, later)
	mustRead(t, tier, never)
}

func TestReopenSmallerCapacity(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	const size = 3 * align
	var bs []*testBlock
	for i := range 6 {
		bs = append(bs, newBlock(fmt.Sprint("t", i%2), fmt.Sprint(i), size))
	}
	writeBlocks(t, cfg, bs...)

	cfg.CapacityBytes = 2*fileBytes(size) + fileBytes(size)/2
	tier := open(t, cfg)
	r := tier.Opened()
	if r.Blocks != 2 || r.Evicted != 4 || r.Bytes != 2*fileBytes(size) {
		t.Fatalf("Opened() = %+v, want 2 blocks in %d bytes, 4 evicted", r, 2*fileBytes(size))
	}
	if s := tier.Stats(); s.Bytes > cfg.CapacityBytes || s.Blocks != 2 {
		t.Fatalf("%d blocks in %d bytes, capacity %d", s.Blocks, s.Bytes, cfg.CapacityBytes)
	}
	if files := blockFiles(t, cfg.Dir); len(files) != 2 {
		t.Fatalf("%d files left, want 2: %v", len(files), files)
	}
	held := 0
	for _, b := range bs {
		if holds(tier, b) {
			mustRead(t, tier, b)
			held++
		} else {
			mustMiss(t, tier, b)
		}
	}
	if held != 2 {
		t.Fatalf("%d blocks readable, want 2", held)
	}
}

func TestOpenRefusesForeignDirectory(t *testing.T) {
	dir := t.TempDir()
	notes := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(notes, []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	tier, err := Open(testConfig(t, dir))
	if err == nil {
		tier.Close()
		t.Fatal("Open took a directory that holds another program's files")
	}
	if !strings.Contains(err.Error(), "not a kvpool disk directory") || !strings.Contains(err.Error(), "notes.txt") {
		t.Fatalf("error %q does not say why", err)
	}
	if b, err := os.ReadFile(notes); err != nil || string(b) != "mine" {
		t.Fatalf("the directory's file was touched: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(dir, markerName)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the refused directory was marked (%v)", err)
	}
}

func TestConfigValidate(t *testing.T) {
	_, err := Open(Config{Writers: 100, IO: 9})
	if err == nil {
		t.Fatal("Open took an empty config")
	}
	for _, want := range []string{"no directory", "capacity", "I/O mode", "writers"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not report %q", err, want)
		}
	}
	for _, s := range []string{"auto", "direct", "buffered"} {
		if m, err := ParseIOMode(s); err != nil || m.String() != s {
			t.Errorf("ParseIOMode(%q) = %v, %v", s, m, err)
		}
	}
	if _, err := ParseIOMode("fast"); err == nil {
		t.Error("ParseIOMode took an unknown mode")
	}
}

func TestOpenLocked(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	first, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	second, err := Open(cfg)
	if err == nil {
		second.Close()
		first.Close()
		t.Fatal("a second Open of a directory in use succeeded")
	}
	if !strings.Contains(err.Error(), "in use") {
		t.Fatalf("error %q does not say the directory is in use", err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if err := first.Close(); err != nil {
		t.Fatalf("a second Close: %v", err)
	}
	open(t, cfg) // free again
}

// TestOpenFailureReleasesLock: an Open that fails after it took the
// directory's lock lets it go, so a later Open is not refused as "in use".
func TestOpenFailureReleasesLock(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	first, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	first.Close()
	// A file where a fan-out directory belongs makes Open fail.
	sub := filepath.Join(cfg.Dir, "blocks", "7f")
	if err := os.Remove(sub); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(sub, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if tier, err := Open(cfg); err == nil {
		tier.Close()
		t.Fatal("Open succeeded with a file in place of blocks/7f")
	}
	if err := os.Remove(sub); err != nil {
		t.Fatal(err)
	}
	open(t, cfg)
}

func TestTenantQuota(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.Writers = 1 // writes in offer order, so LRU order is known
	tier := open(t, cfg)
	sink := &recordingSink{}
	tier.SetSink(sink)
	const size = 2 * align
	fb := fileBytes(size)
	tier.SetTenant("a", &eviction.TenantConfig{DiskQuotaBytes: 2 * fb})
	run(t, tier)

	// b is the larger user, but a's quota evicts a's own blocks.
	var a, b []*testBlock
	for i := range 4 {
		b = append(b, newBlock("b", fmt.Sprint(i), size))
	}
	for i := range 3 {
		a = append(a, newBlock("a", fmt.Sprint(i), size))
	}
	mustOffer(t, tier, b...)
	mustOffer(t, tier, a...)
	s := settle(t, tier, 7)
	if s.Evicted != 1 || s.Blocks != 6 {
		t.Fatalf("%d evicted, %d blocks: want 1, 6", s.Evicted, s.Blocks)
	}
	mustMiss(t, tier, a[0])
	for _, x := range append(slices.Clone(b), a[1:]...) {
		mustRead(t, tier, x)
	}
	if _, removed := sink.lists(); !slices.Equal(removed, ids(a[0])) {
		t.Fatalf("the sink heard %v removed, want %v", removed, ids(a[0]))
	}

	// A lower quota evicts at once.
	tier.SetTenant("a", &eviction.TenantConfig{DiskQuotaBytes: fb})
	if s := tier.Stats(); s.Evicted != 2 || s.Blocks != 5 {
		t.Fatalf("after lowering a's quota: %d evicted, %d blocks", s.Evicted, s.Blocks)
	}
	mustMiss(t, tier, a[1])
	mustRead(t, tier, a[2])

	// A policy change keeps the blocks.
	tier.SetTenant("b", &eviction.TenantConfig{Policy: eviction.FIFO})
	if s := tier.Stats(); s.Blocks != 5 {
		t.Fatalf("a new policy lost blocks: %d held", s.Blocks)
	}
	for _, x := range append(slices.Clone(b), a[2]) {
		mustRead(t, tier, x)
	}

	// Back to the default: no quota, nothing more evicted.
	tier.SetTenant("a", nil)
	a3 := newBlock("a", "3", size)
	mustOffer(t, tier, a3)
	if s := settle(t, tier, 8); s.Blocks != 6 || s.Evicted != 2 {
		t.Fatalf("after returning a to the default: %d blocks, %d evicted", s.Blocks, s.Evicted)
	}
}

func TestCapacityEviction(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.Writers = 1
	const size = align
	fb := fileBytes(size)
	cfg.CapacityBytes = 3 * fb
	tier := open(t, cfg)
	sink := &recordingSink{}
	tier.SetSink(sink)
	var bs []*testBlock
	for i := range 5 {
		bs = append(bs, newBlock("t", fmt.Sprint(i), size))
	}
	mustOffer(t, tier, bs...)
	run(t, tier)
	s := settle(t, tier, 5)
	if s.Spilled != 5 || s.Evicted != 2 || s.Blocks != 3 || s.Bytes != 3*fb {
		t.Fatalf("stats %+v: want 5 spilled, 2 evicted, 3 blocks in %d bytes", s, 3*fb)
	}
	mustMiss(t, tier, bs[0])
	mustMiss(t, tier, bs[1])
	for _, b := range bs[2:] {
		mustRead(t, tier, b)
	}
	added, removed := sink.lists()
	if !slices.Equal(added, ids(bs...)) || !slices.Equal(removed, ids(bs[:2]...)) {
		t.Fatalf("the sink heard added %q, removed %q", added, removed)
	}
}

// TestCapacityRespectsQuota: disk-wide pressure never takes a tenant
// below its quota; when nothing else can go, the write is skipped.
func TestCapacityRespectsQuota(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.Writers = 1
	const size = align
	fb := fileBytes(size)
	cfg.CapacityBytes = 4 * fb
	tier := open(t, cfg)
	tier.SetTenant("a", &eviction.TenantConfig{DiskQuotaBytes: 2 * fb})
	a := []*testBlock{newBlock("a", "0", size), newBlock("a", "1", size)}
	b := []*testBlock{newBlock("b", "0", size), newBlock("b", "1", size), newBlock("b", "2", size)}
	mustOffer(t, tier, a...)
	mustOffer(t, tier, b...)
	run(t, tier)
	if s := settle(t, tier, 5); s.Evicted != 1 || s.Blocks != 4 {
		t.Fatalf("%d evicted, %d blocks: want 1, 4", s.Evicted, s.Blocks)
	}
	mustMiss(t, tier, b[0])
	for _, x := range []*testBlock{a[0], a[1], b[1], b[2]} {
		mustRead(t, tier, x)
	}

	// Now only a's guaranteed blocks and c's own could go; c has none.
	tier.SetTenant("b", &eviction.TenantConfig{DiskQuotaBytes: 2 * fb})
	c := newBlock("c", "0", size)
	mustOffer(t, tier, c)
	if s := settle(t, tier, 6); s.Skips[skipFull] != 1 || s.Blocks != 4 {
		t.Fatalf("skips %v, %d blocks: want 1 full, 4 blocks", s.Skips, s.Blocks)
	}
	checkDone(t, c)
	mustMiss(t, tier, c)
}

// TestRemoveDuringWrite: a block removed while it is queued or written is
// thrown away when its write ends.
func TestRemoveDuringWrite(t *testing.T) {
	tier := open(t, testConfig(t, t.TempDir()))
	sink := &recordingSink{}
	tier.SetSink(sink)
	gone, kept := newBlock("t", "gone", 9000), newBlock("t", "kept", 9000)
	mustOffer(t, tier, gone, kept)
	if tier.Remove([]byte("t"), []byte("ns"), gone.key) {
		t.Fatal("Remove of a block not yet written reported one removed")
	}
	run(t, tier)
	s := settle(t, tier, 2)
	if s.Skips[skipRemoved] != 1 || s.Spilled != 1 || s.PendingBytes != 0 {
		t.Fatalf("skips %v, %d spilled: want 1 removed, 1 spilled", s.Skips, s.Spilled)
	}
	checkDone(t, gone, kept)
	mustMiss(t, tier, gone)
	mustRead(t, tier, kept)

	// Removing a held block deletes its file and tells the sink.
	if !tier.Remove([]byte("t"), []byte("ns"), kept.key) {
		t.Fatal("Remove of a held block reported none")
	}
	mustMiss(t, tier, kept)
	if tier.Remove([]byte("t"), []byte("ns"), kept.key) {
		t.Fatal("a second Remove reported a block")
	}
	added, removed := sink.lists()
	if !slices.Equal(added, ids(kept)) || !slices.Equal(removed, ids(kept)) {
		t.Fatalf("the sink heard added %q, removed %q", added, removed)
	}
	// The name may be offered again.
	gone.done.Store(0)
	mustOffer(t, tier, gone)
	settle(t, tier, 3)
	mustRead(t, tier, gone)
}

func TestSweep(t *testing.T) {
	clock := newClock()
	cfg := testConfig(t, t.TempDir())
	cfg.Now = clock.Now
	tier := open(t, cfg)
	sink := &recordingSink{}
	tier.SetSink(sink)
	first, second, never, dead := newBlock("t", "first", 100), newBlock("t", "second", 100), newBlock("t", "never", 100), newBlock("t", "dead", 100)
	first.expires, second.expires = clock.At(time.Minute), clock.At(2*time.Minute)
	dead.expires = clock.At(0) // ended before it is written
	mustOffer(t, tier, first, second, never, dead)
	run(t, tier)
	if s := settle(t, tier, 4); s.Spilled != 3 || s.Skips[skipExpired] != 1 {
		t.Fatalf("%d spilled, skips %v: want 3, 1 expired", s.Spilled, s.Skips)
	}
	mustMiss(t, tier, dead)
	if n := tier.Sweep(clock.Now()); n != 0 {
		t.Fatalf("Sweep before any TTL ended = %d", n)
	}

	clock.Add(90 * time.Second)
	if holds(tier, first) {
		t.Fatal("a block past its TTL is held before the sweep")
	}
	if n := tier.Sweep(clock.Now()); n != 1 {
		t.Fatalf("Sweep = %d, want 1", n)
	}
	mustMiss(t, tier, first)
	mustRead(t, tier, second)
	if n := tier.Sweep(clock.Now()); n != 0 {
		t.Fatalf("a second Sweep = %d", n)
	}
	clock.Add(time.Hour)
	if n := tier.Sweep(clock.Now()); n != 1 {
		t.Fatalf("Sweep = %d, want 1", n)
	}
	mustMiss(t, tier, second)
	mustRead(t, tier, never)
	if s := tier.Stats(); s.Expired != 2 || s.Blocks != 1 {
		t.Fatalf("%d expired, %d blocks: want 2, 1", s.Expired, s.Blocks)
	}
	if _, removed := sink.lists(); !slices.Equal(removed, ids(first, second)) {
		t.Fatalf("the sink heard %q removed", removed)
	}
}

func TestSink(t *testing.T) {
	tier := open(t, testConfig(t, t.TempDir()))
	sink := &recordingSink{}
	tier.SetSink(sink)
	var bs []*testBlock
	for i := range 6 {
		bs = append(bs, newBlock(fmt.Sprint("t", i%2), fmt.Sprint(i), 100*i+1))
	}
	mustOffer(t, tier, bs...)
	run(t, tier)
	settle(t, tier, 6)
	added, removed := sink.lists()
	slices.Sort(added)
	want := ids(bs...)
	slices.Sort(want)
	if !slices.Equal(added, want) || len(removed) != 0 {
		t.Fatalf("the sink heard added %q, removed %q; want added %q", added, removed, want)
	}
	tier.Remove([]byte(bs[0].tenant), []byte("ns"), bs[0].key)
	// A block dropped by a failed read is removed too.
	if err := os.Remove(bs[1].path(tier.cfg.Dir)); err != nil {
		t.Fatal(err)
	}
	if _, err := bs[1].read(tier); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("Read of a block whose file is gone: %v, want ErrNotFound", err)
	}
	if n := tier.Stats().ReadFailures[failMissing]; n != 1 {
		t.Fatalf("read failures[missing] = %d, want 1", n)
	}
	if _, removed := sink.lists(); !slices.Equal(removed, ids(bs[0], bs[1])) {
		t.Fatalf("the sink heard %q removed, want %q", removed, ids(bs[0], bs[1]))
	}
}

func TestForEach(t *testing.T) {
	tier := open(t, testConfig(t, t.TempDir()))
	var bs []*testBlock
	for i := range 10 {
		bs = append(bs, newBlock(fmt.Sprint("t", i%3), fmt.Sprint(i), 10))
	}
	mustOffer(t, tier, bs...)
	run(t, tier)
	settle(t, tier, 10)
	tier.Remove([]byte(bs[4].tenant), []byte("ns"), bs[4].key)

	var seen []string
	tier.ForEach(func(tenant, namespace string, key []byte) bool {
		seen = append(seen, blockID(tenant, namespace, key))
		return true
	})
	want := ids(append(slices.Clone(bs[:4]), bs[5:]...)...)
	slices.Sort(seen)
	slices.Sort(want)
	if !slices.Equal(seen, want) {
		t.Fatalf("ForEach saw %q, want %q", seen, want)
	}
	n := 0
	tier.ForEach(func(string, string, []byte) bool { n++; return n < 3 })
	if n != 3 {
		t.Fatalf("ForEach went on for %d blocks after yield returned false at 3", n)
	}
}

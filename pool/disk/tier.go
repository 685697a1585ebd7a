package disk

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/eviction"
)

// Config is a disk tier's configuration.
type Config struct {
	// Dir holds the tier's files. Required; created when missing. It
	// must be empty or a kvpool disk directory, and one daemon's alone.
	Dir string
	// CapacityBytes bounds the bytes of the tier's files (a 4 KiB header
	// and the block padded to 4 KiB each). Required.
	CapacityBytes int64
	// IO is how files are read and written. Default IOAuto.
	IO IOMode
	// Writers is how many blocks are written at once. Default 2: one
	// write in flight while the next is set up; a drive's bandwidth is
	// reached with a few large writes.
	Writers int
	// MaxPendingBytes bounds the blocks offered and not yet written.
	// Their bytes stay pinned in the arena until written, so this is
	// memory the arena cannot evict meanwhile; offers past it are
	// declined (and offered again later). Default 256 MiB.
	MaxPendingBytes int64
	// MaxBlockBytes is the largest block the tier stores. Default 64 MiB.
	MaxBlockBytes int64
	// DefaultTenant is the config of tenants without a stored policy:
	// its Policy orders their disk blocks and DiskQuotaBytes caps them.
	DefaultTenant eviction.TenantConfig
	// Logger receives the tier's logs. Default: discard.
	Logger *slog.Logger
	// Now is the clock (TTLs). Default time.Now.
	Now func() time.Time
}

// Defaults.
const (
	DefaultWriters         = 2
	DefaultMaxPendingBytes = 256 << 20
	DefaultMaxBlockBytes   = 64 << 20
)

func (c *Config) fill() {
	if c.Writers == 0 {
		c.Writers = DefaultWriters
	}
	if c.MaxPendingBytes == 0 {
		c.MaxPendingBytes = DefaultMaxPendingBytes
	}
	if c.MaxBlockBytes == 0 {
		c.MaxBlockBytes = DefaultMaxBlockBytes
	}
	c.DefaultTenant = c.DefaultTenant.WithDefaults()
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate reports every problem with c (after defaults).
func (c *Config) Validate() error {
	var errs []error
	if c.Dir == "" {
		errs = append(errs, errors.New("no directory (--disk-dir)"))
	}
	if c.CapacityBytes < fileBytes(1) {
		errs = append(errs, fmt.Errorf("capacity %d bytes (--disk-capacity): want at least %d", c.CapacityBytes, fileBytes(1)))
	}
	if c.IO > IOBuffered {
		errs = append(errs, fmt.Errorf("unknown I/O mode %v", c.IO))
	}
	if c.Writers < 1 || c.Writers > 64 {
		errs = append(errs, fmt.Errorf("%d writers: want 1 to 64", c.Writers))
	}
	if c.MaxPendingBytes < 1 {
		errs = append(errs, fmt.Errorf("max pending %d bytes: want > 0", c.MaxPendingBytes))
	}
	if c.MaxBlockBytes < 1 {
		errs = append(errs, fmt.Errorf("max block %d bytes: want > 0", c.MaxBlockBytes))
	}
	if err := c.DefaultTenant.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("disk: invalid config: %w", err)
	}
	return nil
}

// Sink hears which blocks the tier holds: the cluster map publishes them.
// Calls come after the change, outside the tier's lock, and MUST NOT
// block.
type Sink interface {
	AddedDisk(tenant, namespace, key []byte)
	RemovedDisk(tenant, namespace, key []byte)
}

// Tier is a node's disk tier. Every method is safe for concurrent use;
// one mutex guards the index and is never held during I/O. Run writes
// the offered blocks until its context ends; Close releases the
// directory after Run has returned.
type Tier struct {
	cfg    Config
	blocks string // cfg.Dir/blocks
	direct bool
	lock   *os.File // holds the directory's flock
	sink   Sink
	jobs   chan *job
	// pending is the bytes offered and not yet written or dropped.
	pending atomic.Int64
	rate    rateEstimate
	stats   counters
	opened  OpenReport

	mu struct {
		sync.Mutex
		blocks  map[string]*block
		ids     []*block // eviction id - 1 → block; nil when free
		freeIDs []eviction.ID
		tenants map[string]*tenant
		// used is the file bytes of the blocks and of the writes in
		// flight (reserved before they start).
		used int64
		// writing are the blocks offered and not yet in the index.
		writing map[string]*job
		expiry  expiryHeap
		// stopped is set when Run returns: offers are declined from
		// then on, as nothing would write them.
		stopped bool
	}
}

// block is one file of the index. Guarded by Tier.mu.
type block struct {
	id              eviction.ID
	name            string // blockID(tenant, namespace, key)
	tenant          *tenant
	namespace       string
	key             []byte
	size            int64
	crc             uint32
	expiresUnixNano int64
	path            string // under Tier.blocks
}

// tenant is one tenant's books on the disk. Guarded by Tier.mu.
type tenant struct {
	name     string
	cfg      eviction.TenantConfig
	policy   eviction.Policy
	bytes    int64 // file bytes of its blocks
	reserved int64 // file bytes of its writes in flight
	blocks   int64
}

// job is an offered block waiting for a writer.
type job struct {
	tenant, namespace string
	key               []byte
	data              []byte
	crc               uint32
	expiresUnixNano   int64
	done              func()
	// removed is set (under Tier.mu) when Remove asks for the block
	// while it is being written: the write is then thrown away.
	removed bool
}

// OpenReport is what Open found in the directory.
type OpenReport struct {
	// Blocks and Bytes are what it adopted (file bytes).
	Blocks int
	Bytes  int64
	// Dropped are files it deleted: a header that does not decode, a
	// length that does not match it, a file under another block's name;
	// Expired the blocks whose TTL had ended; Evicted the blocks past a
	// smaller capacity; Partial the writes a stop cut short.
	Dropped, Expired, Evicted, Partial int
	// Direct is whether files use direct I/O.
	Direct bool
	// ProbeReadBytesPerSecond is what reading a probe file measured: the
	// read rate until promotions measure it.
	ProbeReadBytesPerSecond float64
	Took                    time.Duration
}

// markerName marks a directory as a kvpool disk tier.
const (
	markerName    = "KVPOOL-DISK"
	markerContent = "kvpool disk tier, format 1: one block per file under blocks/; safe to delete with the daemon stopped\n"
	lockName      = "LOCK"
)

// Open opens (or creates) the tier in cfg.Dir and rebuilds its index
// from the block files' headers.
func Open(cfg Config) (*Tier, error) {
	cfg.fill()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	begin := time.Now()
	t := &Tier{cfg: cfg, blocks: filepath.Join(cfg.Dir, "blocks"), jobs: make(chan *job, 4096)}
	t.mu.blocks = map[string]*block{}
	t.mu.tenants = map[string]*tenant{}
	t.mu.writing = map[string]*job{}
	fail := func(err error) (*Tier, error) { t.Close(); return nil, err }
	// NB: claim can fail after it took the flock (a fan-out directory it
	// cannot make); the lock must go with the failed Open, or every later
	// Open in this process is refused as "in use".
	if err := t.claim(); err != nil {
		return fail(err)
	}
	switch cfg.IO {
	case IOBuffered:
	default:
		ok, err := probeDirect(cfg.Dir)
		if err != nil {
			return fail(err)
		}
		if !ok && cfg.IO == IODirect {
			return fail(fmt.Errorf("disk: %s does not take direct I/O (O_DIRECT); use --disk-io buffered or auto", cfg.Dir))
		}
		t.direct = ok
	}
	t.opened.Direct = t.direct
	probe, err := t.probeRead()
	if err != nil {
		return fail(err)
	}
	t.opened.ProbeReadBytesPerSecond = probe
	t.rate.seed(probe)
	if err := t.scan(); err != nil {
		return fail(err)
	}
	t.opened.Took = time.Since(begin)
	return t, nil
}

// claim makes the directory the tier's: created, marked, locked.
func (t *Tier) claim() error {
	dir := t.cfg.Dir
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("disk: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("disk: %w", err)
	}
	marked := false
	for _, e := range entries {
		marked = marked || e.Name() == markerName
	}
	if !marked {
		for _, e := range entries {
			if n := e.Name(); n != lockName && n != "blocks" {
				return fmt.Errorf("disk: %s holds %s and is not a kvpool disk directory; give an empty directory or one a daemon made (--disk-dir)", dir, n)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, markerName), []byte(markerContent), 0o600); err != nil {
			return fmt.Errorf("disk: %w", err)
		}
	}
	f, err := os.OpenFile(filepath.Join(dir, lockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("disk: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return fmt.Errorf("disk: %s is in use by another daemon: %w", dir, err)
	}
	t.lock = f
	for i := range 256 {
		if err := os.MkdirAll(filepath.Join(t.blocks, fmt.Sprintf("%02x", i)), 0o700); err != nil {
			return fmt.Errorf("disk: %w", err)
		}
	}
	return nil
}

// probeBytes is the probe file's length: long enough that a read's fixed
// costs do not dominate, short enough to cost a start nothing.
const probeBytes = 4 << 20

// probeRead writes a probe file and times reading it back, with the
// tier's I/O mode (buffered: after dropping it from the page cache).
//
// NB: a file system with less than probeBytes free (a nearly full disk, a
// small one) must not fail Open, which would take the node down over a
// measurement: the probe halves until it fits, down to one unit.
func (t *Tier) probeRead() (float64, error) {
	for n := probeBytes; ; n /= 2 {
		bps, err := t.probeReadBytes(n)
		if err != nil && n > align && writeFailure(err) == writeNoSpace {
			continue
		}
		return bps, err
	}
}

// probeReadBytes is probeRead with a probe of n bytes (a multiple of the
// unit).
func (t *Tier) probeReadBytes(n int) (float64, error) {
	p := filepath.Join(t.cfg.Dir, "read-probe"+tmpExt)
	defer os.Remove(p)
	fd, err := unix.Open(p, openFlags(unix.O_RDWR|unix.O_CREAT|unix.O_TRUNC, t.direct), 0o600)
	if err != nil {
		return 0, fmt.Errorf("disk: probe: %w", err)
	}
	defer unix.Close(fd)
	buf := alignedBuffer(n)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	if err := writeFull(fd, [][]byte{buf}, 0); err != nil {
		return 0, fmt.Errorf("disk: probe %s: %w", t.cfg.Dir, err)
	}
	if !t.direct {
		unix.Fdatasync(fd)
		unix.Fadvise(fd, 0, int64(n), unix.FADV_DONTNEED)
	}
	begin := time.Now()
	if err := readFull(fd, [][]byte{buf}, 0); err != nil {
		return 0, fmt.Errorf("disk: probe %s: %w", t.cfg.Dir, err)
	}
	return float64(n) / max(time.Since(begin).Seconds(), 1e-6), nil
}

// scan rebuilds the index from the files' headers, dropping what it
// cannot trust, with a few readers: a header read is one small I/O, and a
// drive serves many at once.
func (t *Tier) scan() error {
	type found struct {
		h    header
		path string
	}
	paths := make(chan string, 256)
	results := make(chan found, 256)
	var dropped, partial atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			buf := pageBuffers.Get().(*[]byte)
			defer pageBuffers.Put(buf)
			for p := range paths {
				h, err := t.readHeader(p, *buf)
				if err != nil {
					t.cfg.Logger.Warn("dropping a block file", "path", p, "err", err)
					os.Remove(filepath.Join(t.blocks, p))
					dropped.Add(1)
					continue
				}
				results <- found{h, p}
			}
		})
	}
	var walkErr error
	go func() {
		defer close(paths)
		for i := range 256 {
			sub := fmt.Sprintf("%02x", i)
			entries, err := os.ReadDir(filepath.Join(t.blocks, sub))
			if err != nil {
				walkErr = fmt.Errorf("disk: %w", err)
				return
			}
			for _, e := range entries {
				name := e.Name()
				switch {
				case strings.HasSuffix(name, tmpExt):
					os.Remove(filepath.Join(t.blocks, sub, name))
					partial.Add(1)
				case strings.HasSuffix(name, fileExt) && e.Type().IsRegular():
					paths <- filepath.Join(sub, name)
				default:
					t.cfg.Logger.Warn("ignoring a file that is not a block file", "path", filepath.Join(t.blocks, sub, name))
				}
			}
		}
	}()
	go func() { wg.Wait(); close(results) }()
	now := t.cfg.Now().UnixNano()
	var evicted []*block
	t.mu.Lock()
	for f := range results {
		h := f.h
		switch {
		case h.expiresUnixNano != 0 && h.expiresUnixNano <= now:
			os.Remove(filepath.Join(t.blocks, f.path))
			t.opened.Expired++
			continue
		case t.mu.blocks[blockID(h.tenant, h.namespace, h.key)] != nil:
			continue // the same block twice cannot happen: one name, one path
		}
		t.insertLocked(h, f.path)
	}
	// A smaller capacity than last time: evict down to it.
	for t.mu.used > t.cfg.CapacityBytes {
		v, ok := t.pressureVictimLocked()
		if !ok {
			break
		}
		evicted = append(evicted, v)
		t.unlinkLocked(v)
	}
	t.opened.Blocks, t.opened.Bytes = len(t.mu.blocks), t.mu.used
	t.mu.Unlock()
	for _, v := range evicted {
		os.Remove(filepath.Join(t.blocks, v.path))
	}
	t.opened.Evicted = len(evicted)
	t.opened.Dropped, t.opened.Partial = int(dropped.Load()), int(partial.Load())
	return walkErr
}

// readHeader reads and checks the header of the file at path (under
// t.blocks), and that the file is as long as the header says and sits
// under the name's path.
func (t *Tier) readHeader(path string, buf []byte) (header, error) {
	fd, err := unix.Open(filepath.Join(t.blocks, path), openFlags(unix.O_RDONLY, t.direct), 0)
	if err != nil {
		return header{}, err
	}
	defer unix.Close(fd)
	if err := readFull(fd, [][]byte{buf[:headerBytes]}, 0); err != nil {
		return header{}, err
	}
	h, err := decodeHeader(buf, t.cfg.MaxBlockBytes)
	if err != nil {
		return header{}, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return header{}, err
	}
	if st.Size < fileBytes(h.size) {
		return header{}, fmt.Errorf("%w: %d bytes, the header says %d", errShort, st.Size, fileBytes(h.size))
	}
	if want := fileName(blockID(h.tenant, h.namespace, h.key)); want != path {
		return header{}, fmt.Errorf("%w: the file of %s/%s/%x is at %s, not %s", errHeader, h.tenant, h.namespace, h.key, path, want)
	}
	return h, nil
}

// SetSink makes sink hear of every block added and removed from now on.
// Call it before the tier is used concurrently.
func (t *Tier) SetSink(sink Sink) { t.sink = sink }

// Opened reports what Open found.
func (t *Tier) Opened() OpenReport { return t.opened }

// Direct reports whether the tier uses direct I/O.
func (t *Tier) Direct() bool { return t.direct }

// tenantLocked returns tenant name's books, creating them with the
// default config. REQUIRES: t.mu.
func (t *Tier) tenantLocked(name string) *tenant {
	if tn, ok := t.mu.tenants[name]; ok {
		return tn
	}
	tn := &tenant{name: name, cfg: t.cfg.DefaultTenant, policy: eviction.New(t.cfg.DefaultTenant.Policy, eviction.Config{})}
	t.mu.tenants[name] = tn
	return tn
}

// insertLocked adds a written block to the index. REQUIRES: t.mu.
func (t *Tier) insertLocked(h header, path string) *block {
	tn := t.tenantLocked(h.tenant)
	var id eviction.ID
	if k := len(t.mu.freeIDs); k > 0 {
		id = t.mu.freeIDs[k-1]
		t.mu.freeIDs = t.mu.freeIDs[:k-1]
	} else {
		t.mu.ids = append(t.mu.ids, nil)
		id = eviction.ID(len(t.mu.ids))
	}
	b := &block{id: id, name: blockID(h.tenant, h.namespace, h.key), tenant: tn, namespace: h.namespace, key: h.key,
		size: h.size, crc: h.crc, expiresUnixNano: h.expiresUnixNano, path: path}
	t.mu.ids[id-1] = b
	t.mu.blocks[b.name] = b
	fb := fileBytes(b.size)
	t.mu.used += fb
	tn.bytes += fb
	tn.blocks++
	eb := eviction.Block{ID: id, Bytes: fb}
	if b.expiresUnixNano != 0 {
		eb.Expires = time.Unix(0, b.expiresUnixNano)
		heap.Push(&t.mu.expiry, expiryItem{at: b.expiresUnixNano, b: b})
	}
	tn.policy.Add(eb, t.cfg.Now())
	return b
}

// unlinkLocked takes b out of the index; the caller deletes its file
// after the unlock. REQUIRES: t.mu.
func (t *Tier) unlinkLocked(b *block) {
	if t.mu.blocks[b.name] != b {
		return
	}
	delete(t.mu.blocks, b.name)
	t.mu.ids[b.id-1] = nil
	t.mu.freeIDs = append(t.mu.freeIDs, b.id)
	b.tenant.policy.Remove(b.id)
	fb := fileBytes(b.size)
	t.mu.used -= fb
	b.tenant.bytes -= fb
	b.tenant.blocks--
}

// pressureVictimLocked picks the next block disk-wide pressure evicts:
// from the tenant eviction.PickTenant chooses, by its policy.
// REQUIRES: t.mu.
func (t *Tier) pressureVictimLocked() (*block, bool) {
	var names []*tenant
	var usage []eviction.TenantUsage
	for _, tn := range t.mu.tenants {
		names = append(names, tn)
		usage = append(usage, eviction.TenantUsage{UsedBytes: tn.bytes, QuotaBytes: tn.cfg.DiskQuotaBytes, Evictable: tn.policy.Len() > 0})
	}
	i, ok := eviction.PickTenant(usage)
	if !ok {
		return nil, false
	}
	return t.victimLocked(names[i])
}

// victimLocked is tn's policy's next victim. REQUIRES: t.mu.
func (t *Tier) victimLocked(tn *tenant) (*block, bool) {
	for {
		id, ok := tn.policy.Victim(t.cfg.Now(), func(eviction.ID) bool { return false })
		if !ok {
			return nil, false
		}
		if int(id) <= len(t.mu.ids) {
			if b := t.mu.ids[id-1]; b != nil && b.tenant == tn {
				return b, true
			}
		}
		tn.policy.Remove(id) // a stale name
	}
}

// SetTenant applies a tenant's config to its disk blocks: a new policy
// takes them over, a lower disk quota evicts at once. nil returns the
// tenant to the default.
func (t *Tier) SetTenant(name string, cfg *eviction.TenantConfig) {
	next := t.cfg.DefaultTenant
	if cfg != nil {
		next = cfg.WithDefaults()
	}
	var gone []*block
	t.mu.Lock()
	tn := t.tenantLocked(name)
	if next.Policy != tn.cfg.Policy {
		tn.policy = eviction.New(next.Policy, eviction.Config{})
		now := t.cfg.Now()
		for _, b := range t.mu.ids {
			if b != nil && b.tenant == tn {
				eb := eviction.Block{ID: b.id, Bytes: fileBytes(b.size)}
				if b.expiresUnixNano != 0 {
					eb.Expires = time.Unix(0, b.expiresUnixNano)
				}
				tn.policy.Add(eb, now)
			}
		}
	}
	tn.cfg = next
	for q := next.DiskQuotaBytes; q > 0 && tn.bytes > q; {
		v, ok := t.victimLocked(tn)
		if !ok {
			break
		}
		t.unlinkLocked(v)
		gone = append(gone, v)
	}
	t.mu.Unlock()
	t.stats.evicted.Add(uint64(len(gone)))
	t.deleteFiles(gone)
}

// deleteFiles removes the files of blocks already out of the index and
// tells the sink.
func (t *Tier) deleteFiles(gone []*block) {
	for _, b := range gone {
		if err := os.Remove(filepath.Join(t.blocks, b.path)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.cfg.Logger.Warn("cannot delete a block file", "path", b.path, "err", err)
		}
		if t.sink != nil {
			t.sink.RemovedDisk([]byte(b.tenant.name), []byte(b.namespace), b.key)
		}
	}
}

// Offer queues a block for writing: its bytes are data, which the caller
// keeps unchanged until done is called (the store's pin). It never
// blocks; it returns false, without calling done, when the tier already
// holds or is writing the block, the block is too large, or the queue is
// full (MaxPendingBytes). The strings and key may be reused after the
// call.
func (t *Tier) Offer(tenantName, namespace string, key, data []byte, crc uint32, expiresUnixNano int64, done func()) bool {
	size := int64(len(data))
	if size == 0 || size > t.cfg.MaxBlockBytes {
		t.stats.skipped(skipTooLarge)
		return false
	}
	id := blockID(tenantName, namespace, key)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.mu.stopped || t.mu.blocks[id] != nil || t.mu.writing[id] != nil {
		return false
	}
	if t.pending.Load()+size > t.cfg.MaxPendingBytes {
		t.stats.skipped(skipQueueFull)
		return false
	}
	j := &job{tenant: strings.Clone(tenantName), namespace: strings.Clone(namespace), key: append([]byte(nil), key...),
		data: data, crc: crc, expiresUnixNano: expiresUnixNano, done: done}
	select {
	case t.jobs <- j:
	default:
		t.stats.skipped(skipQueueFull)
		return false
	}
	t.mu.writing[id] = j
	t.pending.Add(size)
	return true
}

// Run writes offered blocks with cfg.Writers writers until ctx ends;
// blocks still queued then are dropped (their done is called), and
// offers are declined until Run is called again.
func (t *Tier) Run(ctx context.Context) error {
	t.mu.Lock()
	t.mu.stopped = false
	t.mu.Unlock()
	var wg sync.WaitGroup
	for range t.cfg.Writers {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case j := <-t.jobs:
					t.write(j)
				}
			}
		})
	}
	wg.Wait()
	// Offers hold the lock while they queue: once stopped is set under
	// it, the queue only drains.
	t.mu.Lock()
	t.mu.stopped = true
	t.mu.Unlock()
	for {
		select {
		case j := <-t.jobs:
			t.abandon(j)
		default:
			return nil
		}
	}
}

// abandon drops a queued block unwritten.
func (t *Tier) abandon(j *job) {
	j.done()
	t.mu.Lock()
	delete(t.mu.writing, blockID(j.tenant, j.namespace, j.key))
	t.mu.Unlock()
	t.pending.Add(-int64(len(j.data)))
}

// write stores one offered block: room first (the tenant's disk quota,
// then the tier's capacity), the file written under a temporary name and
// renamed into place, then the index.
func (t *Tier) write(j *job) {
	size := int64(len(j.data))
	id := blockID(j.tenant, j.namespace, j.key)
	need := fileBytes(size)
	var gone []*block
	t.mu.Lock()
	tn := t.tenantLocked(j.tenant)
	reason := t.makeRoomLocked(tn, need, &gone)
	if reason == "" {
		t.mu.used += need
		tn.reserved += need
	}
	t.mu.Unlock()
	t.stats.evicted.Add(uint64(len(gone)))
	t.deleteFiles(gone)

	var err error
	path := fileName(id)
	if reason == "" {
		begin := time.Now()
		err = t.writeFile(path, &header{tenant: j.tenant, namespace: j.namespace, key: j.key, size: size, crc: j.crc,
			expiresUnixNano: j.expiresUnixNano, writtenUnixNano: t.cfg.Now().UnixNano()}, j.data)
		t.stats.writeNanos.Add(uint64(time.Since(begin)))
	}
	j.done() // the bytes are on disk (or will not be): unpin them
	t.pending.Add(-size)

	t.mu.Lock()
	delete(t.mu.writing, id)
	if reason == "" {
		t.mu.used -= need
		tn.reserved -= need
	}
	added := false
	switch {
	case reason != "":
	case err != nil:
		reason = writeFailure(err)
	case j.removed:
		reason = skipRemoved
	case j.expiresUnixNano != 0 && j.expiresUnixNano <= t.cfg.Now().UnixNano():
		reason = skipExpired
	default:
		t.insertLocked(header{tenant: j.tenant, namespace: j.namespace, key: j.key, size: size, crc: j.crc, expiresUnixNano: j.expiresUnixNano}, path)
		added = true
	}
	t.mu.Unlock()
	switch {
	case added:
		t.stats.spilled.Add(1)
		t.stats.spilledBytes.Add(uint64(size))
		if t.sink != nil {
			t.sink.AddedDisk([]byte(j.tenant), []byte(j.namespace), j.key)
		}
	case err != nil:
		t.stats.spillFailed(reason)
		t.cfg.Logger.Warn("cannot write a block to disk; it stays in memory only", "tenant", j.tenant, "namespace", j.namespace,
			"key", fmt.Sprintf("%x", j.key), "err", err)
		os.Remove(filepath.Join(t.blocks, path+tmpExt))
		os.Remove(filepath.Join(t.blocks, path))
	default:
		if reason == skipExpired || reason == skipRemoved {
			os.Remove(filepath.Join(t.blocks, path))
		}
		t.stats.skipped(reason)
	}
}

// makeRoomLocked evicts for a write of need file bytes for tn: first its
// own disk quota, then the tier's capacity. It returns "" when the write
// fits, else why it does not. REQUIRES: t.mu.
func (t *Tier) makeRoomLocked(tn *tenant, need int64, gone *[]*block) string {
	if q := tn.cfg.DiskQuotaBytes; q > 0 {
		if need > q {
			return skipQuota
		}
		for tn.bytes+tn.reserved+need > q {
			v, ok := t.victimLocked(tn)
			if !ok {
				return skipQuota
			}
			t.unlinkLocked(v)
			*gone = append(*gone, v)
		}
	}
	for t.mu.used+need > t.cfg.CapacityBytes {
		v, ok := t.pressureVictimLocked()
		if !ok {
			return skipFull
		}
		t.unlinkLocked(v)
		*gone = append(*gone, v)
	}
	return ""
}

// writeFile writes a block file under a temporary name and renames it
// into place, so a file under a block's name is whole. It does not
// fsync: a file the kernel had not written when the machine went down
// fails its length or CRC check and is dropped, and the disk tier is a
// cache.
func (t *Tier) writeFile(path string, h *header, data []byte) error {
	final := filepath.Join(t.blocks, path)
	tmp := final + tmpExt
	fd, err := unix.Open(tmp, openFlags(unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, t.direct), 0o600)
	if err != nil {
		return err
	}
	hdr := pageBuffers.Get().(*[]byte)
	defer pageBuffers.Put(hdr)
	h.encode(*hdr)
	err = t.writeData(fd, *hdr, data)
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, final)
	}
	return err
}

// writeData writes the header and the block, padded to the unit. Bytes
// aligned in memory go straight from the arena; a tail shorter than the
// unit goes through a zeroed page.
func (t *Tier) writeData(fd int, hdr, data []byte) error {
	if !t.direct || aligned(data) {
		body := data[:len(data)&^(align-1)]
		tail := pageBuffers.Get().(*[]byte)
		defer pageBuffers.Put(tail)
		iovs := [][]byte{hdr, body}
		if rest := data[len(body):]; len(rest) > 0 {
			clear(*tail)
			copy(*tail, rest)
			iovs = append(iovs, *tail)
		}
		return writeFull(fd, iovs, 0)
	}
	// Not aligned in memory (an arena with pages under 4 KiB): through
	// a bounce buffer.
	if err := writeFull(fd, [][]byte{hdr}, 0); err != nil {
		return err
	}
	buf := chunkBuffers.Get().(*[]byte)
	defer chunkBuffers.Put(buf)
	for off := 0; off < len(data); off += chunkBytes {
		n := copy(*buf, data[off:])
		chunk := (*buf)[:roundUp(int64(n))]
		clear(chunk[n:])
		if err := writeFull(fd, [][]byte{chunk}, int64(headerBytes+off)); err != nil {
			return err
		}
	}
	return nil
}

// Size returns the size of the block the tier holds under the name, and
// whether it holds one (TTL not ended).
func (t *Tier) Size(tenantName, namespace, key []byte) (int64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	b, ok := t.lookupLocked(tenantName, namespace, key)
	if !ok {
		return 0, false
	}
	return b.size, true
}

// lookupLocked finds a block whose TTL has not ended. REQUIRES: t.mu.
func (t *Tier) lookupLocked(tenantName, namespace, key []byte) (*block, bool) {
	b := t.mu.blocks[blockID(string(tenantName), string(namespace), key)]
	if b == nil || (b.expiresUnixNano != 0 && b.expiresUnixNano <= t.cfg.Now().UnixNano()) {
		return nil, false
	}
	return b, true
}

// Exists reports for each key whether the tier holds it.
func (t *Tier) Exists(tenantName, namespace []byte, keys [][]byte) ([]bool, error) {
	out := make([]bool, len(keys))
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, k := range keys {
		_, out[i] = t.lookupLocked(tenantName, namespace, k)
	}
	return out, nil
}

// Read copies the block under the name into dst, which must be its size
// long (Size), and returns its CRC: the header must name the block, the
// file must be whole and the bytes must match the CRC stored with them.
// A block that fails any of these, or whose file cannot be read, is
// dropped from the tier (a later read misses) and the read fails with
// api.ErrDataLoss; a block the tier does not hold is api.ErrNotFound.
func (t *Tier) Read(tenantName, namespace, key, dst []byte) (uint32, error) {
	t.mu.Lock()
	b, ok := t.lookupLocked(tenantName, namespace, key)
	if !ok {
		t.mu.Unlock()
		return 0, api.Errorf(api.ErrNotFound, "disk: no block %s/%s/%x", tenantName, namespace, key)
	}
	if int64(len(dst)) != b.size {
		t.mu.Unlock()
		return 0, api.Errorf(api.ErrInvalidArgument, "disk: block %s/%s/%x has %d bytes, not %d", tenantName, namespace, key, b.size, len(dst))
	}
	b.tenant.policy.Touch(b.id, t.cfg.Now())
	want, path := *b, b.path
	t.mu.Unlock()

	begin := time.Now()
	crc, reason, err := t.readFile(path, &want, dst)
	took := time.Since(begin)
	if err != nil {
		t.stats.readFailed(reason)
		t.drop(b)
		if reason == failMissing {
			return 0, api.Errorf(api.ErrNotFound, "disk: block %s/%s/%x: its file is gone", tenantName, namespace, key)
		}
		t.cfg.Logger.Warn("dropping a block the disk could not serve", "tenant", string(tenantName), "namespace", string(namespace),
			"key", fmt.Sprintf("%x", key), "reason", reason, "err", err)
		return 0, api.Errorf(api.ErrDataLoss, "disk: block %s/%s/%x: %v", tenantName, namespace, key, err)
	}
	t.stats.read.Add(1)
	t.stats.readBytes.Add(uint64(len(dst)))
	t.stats.readNanos.Add(uint64(took))
	t.rate.add(float64(len(dst)), took)
	return crc, nil
}

// readFile reads the block file at path into dst and checks it against
// want. It returns the CRC, or why it failed.
func (t *Tier) readFile(path string, want *block, dst []byte) (uint32, string, error) {
	fd, err := unix.Open(filepath.Join(t.blocks, path), openFlags(unix.O_RDONLY, t.direct), 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return 0, failMissing, err
		}
		return 0, failIO, err
	}
	defer unix.Close(fd)
	hdr := pageBuffers.Get().(*[]byte)
	defer pageBuffers.Put(hdr)
	// One read of the header and the block, then one CRC pass (about
	// 0.2 ms for 2 MiB). Splitting the read into parts read at once, or
	// in order with the CRC of each taken during the next's, was slower
	// on the disks measured (kvpool node bench --path disk).
	if err := t.readData(fd, *hdr, dst); err != nil {
		if errors.Is(err, errShort) {
			return 0, failTruncated, err
		}
		return 0, failIO, err
	}
	h, err := decodeHeader(*hdr, t.cfg.MaxBlockBytes)
	if err != nil {
		return 0, failHeader, err
	}
	if h.tenant != want.tenant.name || h.namespace != want.namespace || string(h.key) != string(want.key) || h.size != want.size || h.crc != want.crc {
		return 0, failHeader, fmt.Errorf("%w: the file holds %s/%s/%x (%d bytes, crc %08x)", errHeader, h.tenant, h.namespace, h.key, h.size, h.crc)
	}
	crc := api.Checksum(dst)
	if crc != h.crc {
		return 0, failChecksum, fmt.Errorf("disk: the block's bytes have CRC %08x, its header says %08x", crc, h.crc)
	}
	return crc, "", nil
}

// readData reads the header and the block in one call where dst is
// aligned: the body straight into dst, a tail shorter than the unit into
// a page, copied.
func (t *Tier) readData(fd int, hdr, dst []byte) error {
	if !t.direct || aligned(dst) {
		body := dst[:len(dst)&^(align-1)]
		tail := pageBuffers.Get().(*[]byte)
		defer pageBuffers.Put(tail)
		iovs := [][]byte{hdr, body}
		rest := dst[len(body):]
		if len(rest) > 0 {
			iovs = append(iovs, *tail)
		}
		if err := readFull(fd, iovs, 0); err != nil {
			return err
		}
		copy(rest, *tail)
		return nil
	}
	if err := readFull(fd, [][]byte{hdr}, 0); err != nil {
		return err
	}
	buf := chunkBuffers.Get().(*[]byte)
	defer chunkBuffers.Put(buf)
	for off := 0; off < len(dst); off += chunkBytes {
		n := min(chunkBytes, len(dst)-off)
		if err := readFull(fd, [][]byte{(*buf)[:roundUp(int64(n))]}, int64(headerBytes+off)); err != nil {
			return err
		}
		copy(dst[off:], (*buf)[:n])
	}
	return nil
}

// drop takes b out of the index, if it is still there, and deletes its
// file.
func (t *Tier) drop(b *block) {
	t.mu.Lock()
	in := t.mu.blocks[b.name] == b
	t.unlinkLocked(b)
	t.mu.Unlock()
	if in {
		t.deleteFiles([]*block{b})
	}
}

// Remove deletes the block under the name; false when the tier has none.
func (t *Tier) Remove(tenantName, namespace, key []byte) bool {
	t.mu.Lock()
	id := blockID(string(tenantName), string(namespace), key)
	b := t.mu.blocks[id]
	if b != nil {
		t.unlinkLocked(b)
	}
	if j := t.mu.writing[id]; j != nil {
		j.removed = true
	}
	t.mu.Unlock()
	if b == nil {
		return false
	}
	t.deleteFiles([]*block{b})
	return true
}

// Sweep deletes the blocks whose TTL ended by now and returns how many.
func (t *Tier) Sweep(now time.Time) int {
	var gone []*block
	ns := now.UnixNano()
	t.mu.Lock()
	for t.mu.expiry.Len() > 0 && t.mu.expiry[0].at <= ns {
		it := heap.Pop(&t.mu.expiry).(expiryItem)
		if t.mu.blocks[it.b.name] == it.b {
			t.unlinkLocked(it.b)
			gone = append(gone, it.b)
		}
	}
	t.mu.Unlock()
	t.stats.expired.Add(uint64(len(gone)))
	t.deleteFiles(gone)
	return len(gone)
}

// ForEach calls yield for every block the tier holds until it returns
// false, a chunk of the index at a time (blocks added or removed during
// the walk may or may not be seen).
func (t *Tier) ForEach(yield func(tenant, namespace string, key []byte) bool) {
	const chunk = 4096
	type item struct {
		tenant, namespace string
		key               []byte
	}
	var batch []item
	for start := 0; ; start += chunk {
		batch = batch[:0]
		t.mu.Lock()
		end := min(start+chunk, len(t.mu.ids))
		for _, b := range t.mu.ids[min(start, end):end] {
			if b != nil {
				batch = append(batch, item{b.tenant.name, b.namespace, b.key})
			}
		}
		done := end >= len(t.mu.ids)
		t.mu.Unlock()
		for _, it := range batch {
			if !yield(it.tenant, it.namespace, it.key) {
				return
			}
		}
		if done {
			return
		}
	}
}

// ReadBytesPerSecond is the tier's read rate: a moving average of its
// reads' rates, the probe's until the first read.
func (t *Tier) ReadBytesPerSecond() float64 { return t.rate.get() }

// Close releases the directory. Call it after Run has returned.
func (t *Tier) Close() error {
	if t.lock == nil {
		return nil
	}
	err := t.lock.Close() // drops the flock
	t.lock = nil
	return err
}

// expiryItem orders blocks with a TTL by its end.
type expiryItem struct {
	at int64
	b  *block
}

type expiryHeap []expiryItem

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h expiryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiryHeap) Push(x any)        { *h = append(*h, x.(expiryItem)) }
func (h *expiryHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// rateEstimate is a moving average of read rates, bytes per second.
type rateEstimate struct {
	mu   sync.Mutex
	rate float64
	n    int
}

// rateWeight is a new read's weight in the average: about the last ten
// reads count.
const rateWeight = 0.1

func (r *rateEstimate) seed(bps float64) {
	r.mu.Lock()
	r.rate = bps
	r.mu.Unlock()
}

func (r *rateEstimate) add(bytes float64, took time.Duration) {
	if took <= 0 {
		return
	}
	bps := bytes / took.Seconds()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == 0 {
		r.rate = bps
	} else {
		r.rate += rateWeight * (bps - r.rate)
	}
	r.n++
}

func (r *rateEstimate) get() float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rate
}

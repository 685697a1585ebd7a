package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/pool"
	"github.com/kvpool/kvpool/pool/disk"
	"github.com/kvpool/kvpool/pool/store"
)

// DiskConfig is a disk-tier benchmark (kvpool node bench --path disk).
type DiskConfig struct {
	// Dir is where the tier's directory and the baseline's files go, on
	// the disk to measure. Default os.TempDir().
	Dir string
	// IO is the tier's I/O mode; the baseline uses the one the tier
	// ends up with (auto: direct where the file system takes it).
	IO disk.IOMode
	// BlockBytes is the block size. Default 2 MiB.
	BlockBytes int
	// Clients promote at once, one Fetch of one block at a time each;
	// the read baseline runs as many readers. Default 1.
	Clients int
	// Duration is each round's promote phase; the read baseline takes
	// as long again. Default 3 s.
	Duration time.Duration
	// Rounds repeats read-baseline half, promotes, the other half.
	// Default 1.
	Rounds int
	// WorkingSetBytes is what goes to disk and the promotes cycle
	// through: four times the arena, so each promote reads the disk.
	// Default 1 GiB.
	WorkingSetBytes int64
	// SegmentPath backs the node's arena with a file at this path, as
	// kvpool node serve --segment-path does: on a hugetlbfs mount the
	// arena is in huge pages. The shared-memory baseline then reads into
	// a file beside it, so both land in the same kind of memory. Default
	// "": a memfd for each.
	SegmentPath string
	Progress    *Progress
}

// DiskResult is what a disk benchmark measured (JSON field names are what
// the CLI prints).
type DiskResult struct {
	Path       string `json:"path"`
	BlockBytes int    `json:"block_bytes"`
	Blocks     int    `json:"blocks"`
	Clients    int    `json:"clients"`
	Direct     bool   `json:"direct_io"`
	// Spill: the admitted blocks written behind by the tier's writers,
	// against plain writes of files of the same size by as many writers.
	SpillGBps         float64 `json:"spill_gbps"`
	WriteBaselineGBps float64 `json:"write_baseline_gbps"`
	SpillRatio        float64 `json:"spill_ratio"`
	// Promote: Fetches of blocks only the disk holds (reserve, read into
	// the arena, verify, commit), against plain sequential reads of files
	// of the same size.
	//
	// The baseline reads into shared memory of the arena's kind and
	// size (a memfd, or huge pages beside a hugetlbfs arena), a block's
	// worth further each time, as promotes land in the arena. The private
	// baseline reads into one reused private buffer: its rate follows how
	// contiguous that buffer's pages happen to be (a direct read becomes
	// one device request or several; the KiB-per-request fields show it)
	// and, on a virtual machine, how hot one destination stays in the
	// host's caches, so it is reported but not the measure.
	PromoteGBps             float64 `json:"promote_gbps"`
	ReadBaselineGBps        float64 `json:"read_baseline_gbps"`
	PromoteRatio            float64 `json:"promote_ratio"`
	ReadPrivateBaselineGBps float64 `json:"read_private_baseline_gbps"`
	PromotePrivateRatio     float64 `json:"promote_private_ratio"`
	// KiB per read request the disk completed during the promotes and
	// each baseline (iostat's rareq-sz; 0 where the directory is not on
	// a block device). A 2 MiB read that the kernel had to split,
	// because its destination's pages are not contiguous, shows here.
	PromoteKiBPerRequest      float64 `json:"promote_kib_per_request"`
	ReadBaselineKiBPerRequest float64 `json:"read_baseline_kib_per_request"`
	ReadPrivateKiBPerRequest  float64 `json:"read_private_kib_per_request"`
	Promotes                  int64   `json:"promotes"`
	P50Ms                     float64 `json:"p50_ms"`
	// ReadMsPerPromote is the part of a promote spent in the tier's
	// read (file I/O and CRC); the rest is the Fetch call, reserve,
	// commit and the eviction that makes room.
	ReadMsPerPromote float64     `json:"read_ms_per_promote"`
	P99Ms            float64     `json:"p99_ms"`
	Rounds           []DiskRound `json:"rounds,omitempty"`
}

// DiskRound is one round's promote figures.
type DiskRound struct {
	PromoteGBps      float64 `json:"promote_gbps"`
	ReadBaselineGBps float64 `json:"read_baseline_gbps"`
	Ratio            float64 `json:"ratio"`
}

func (c *DiskConfig) fill() error {
	if c.Dir == "" {
		c.Dir = os.TempDir()
	}
	if c.BlockBytes == 0 {
		c.BlockBytes = 2 << 20
	}
	if c.Clients == 0 {
		c.Clients = 1
	}
	if c.Duration == 0 {
		c.Duration = 3 * time.Second
	}
	if c.Rounds == 0 {
		c.Rounds = 1
	}
	if c.WorkingSetBytes == 0 {
		c.WorkingSetBytes = 1 << 30
	}
	var errs []error
	if c.BlockBytes < 1 || c.BlockBytes > 64<<20 {
		errs = append(errs, fmt.Errorf("block size %d: want 1 byte to 64 MiB", c.BlockBytes))
	}
	if c.Clients < 1 || c.Rounds < 1 || c.Duration <= 0 {
		errs = append(errs, errors.New("clients and rounds must be at least 1 and the duration positive"))
	}
	if c.WorkingSetBytes < 16*int64(c.BlockBytes) {
		errs = append(errs, fmt.Errorf("working set %d bytes: want at least 16 blocks", c.WorkingSetBytes))
	}
	return errors.Join(errs...)
}

// diskWriters is the tier's default writer count: the write baseline
// runs as many.
const diskWriters = disk.DefaultWriters

// RunDisk measures a node's disk tier: how fast admitted blocks spill to
// disk, and how fast Fetch promotes blocks only the disk holds, each
// against plain file I/O of the same sizes and I/O mode on the same disk,
// in the same run.
func RunDisk(ctx context.Context, cfg DiskConfig) (*DiskResult, error) {
	if err := cfg.fill(); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	root, err := os.MkdirTemp(cfg.Dir, "kvpool-bench-disk-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(root)
	blocks := int(cfg.WorkingSetBytes / int64(cfg.BlockBytes))
	arena := max(cfg.WorkingSetBytes/4, 64<<20)
	// The plain reads' shared memory is allocated with the arena, before
	// the node: memory allocated later was measured to take direct reads
	// faster on a virtual machine (its host's backing differs), which
	// would flatter the baseline.
	shared, free, err := sharedBuffer(int(arena), cfg.SegmentPath)
	if err != nil {
		return nil, err
	}
	defer free()
	pc := pool.DefaultConfig("bench-disk", arena)
	pc.ListenAddr = "127.0.0.1:0"
	pc.DisableShm, pc.ShmSocket = true, ""
	pc.MaxBlockBytes = 64 << 20
	pc.Prefault = true
	pc.SegmentPath = cfg.SegmentPath
	pc.DiskMaxPendingBytes = arena / 2 // a whole batch (below) queues at once
	pc.DiskDir, pc.DiskCapacityBytes, pc.DiskIO = filepath.Join(root, "tier"), 2*cfg.WorkingSetBytes+64<<20, cfg.IO
	n, err := pool.New(pc)
	if err != nil {
		return nil, err
	}
	nctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(nctx) }()
	defer func() { cancel(); <-done; n.Close() }()
	<-n.Ready()
	tier := n.Disk()
	res := &DiskResult{Path: "disk", BlockBytes: cfg.BlockBytes, Blocks: blocks, Clients: cfg.Clients, Direct: tier.Direct()}

	c, err := api.Dial(ctx, api.ClientConfig{Server: n.Addr().String(), Path: api.PathData})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	const tenant, namespace = "bench", "disk"
	keys := make([][]byte, blocks)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "disk-%d-%d", cfg.BlockBytes, i)
	}

	// Spill: batches that fit the arena and the tier's pending bound,
	// put and read once; the second read (in process, so the clock sees
	// the disk and not the reads) admits them, and the batch is timed
	// until the tier has written it.
	batch := int(arena / 2 / int64(cfg.BlockBytes))
	v := make([]byte, cfg.BlockBytes)
	var spillBytes int64
	var spillTime time.Duration
	// The baseline's files: as many, as large, written by as many writers
	// with the same I/O mode, a batch after each batch spilled, so both
	// meet the disk in the same state (a virtual disk's host cache too).
	base := &fileBaseline{dir: filepath.Join(root, "plain"), direct: tier.Direct(), size: int(roundUp(int64(cfg.BlockBytes))), files: blocks}
	if err := os.Mkdir(base.dir, 0o700); err != nil {
		return nil, err
	}
	var wrote int64
	var wroteTime time.Duration
	st := n.Store()
	for start := 0; start < blocks; start += batch {
		end := min(start+batch, blocks)
		for i := start; i < end; i++ {
			fillValue(v, uint64(i))
			if err := c.Put(ctx, api.BlockKey{Tenant: tenant, Namespace: namespace, Key: keys[i]}, v); err != nil {
				return nil, fmt.Errorf("bench: put: %w", err)
			}
			if err := readOnce(st, tenant, namespace, keys[i]); err != nil {
				return nil, err
			}
		}
		want := tier.Stats().Spilled + uint64(end-start)
		begin := time.Now()
		for i := start; i < end; i++ {
			if err := readOnce(st, tenant, namespace, keys[i]); err != nil {
				return nil, err
			}
		}
		for tier.Stats().Spilled < want {
			if s := tier.Stats(); s.WriteFailures["no_space"]+s.WriteFailures["io"] > 0 {
				return nil, fmt.Errorf("bench: the disk tier failed writes: %v", s.WriteFailures)
			}
			time.Sleep(200 * time.Microsecond)
		}
		spillTime += time.Since(begin)
		spillBytes += int64(end-start) * int64(cfg.BlockBytes)
		w, took, err := base.write(diskWriters, start, end)
		if err != nil {
			return nil, fmt.Errorf("bench: write baseline: %w", err)
		}
		wrote += w
		wroteTime += took
		cfg.Progress.Phase("spill", float64(end)/float64(blocks), gbps(spillBytes, spillTime))
	}
	res.SpillGBps = float64(spillBytes) / spillTime.Seconds() / 1e9

	res.WriteBaselineGBps = float64(wrote) / wroteTime.Seconds() / 1e9
	res.SpillRatio = res.SpillGBps / res.WriteBaselineGBps

	// Promote: the clients cycle through the keys from spread starts;
	// the arena holds a quarter of them, so what they come back to has
	// been evicted. Only Fetches that read the disk count.
	var total measurement
	var baseTotal, privateTotal meter
	dev := deviceReadsOf(root)
	var promoteIO, sharedIO, privateIO ioCount
	if err := base.setBuffers(shared, cfg.Clients); err != nil {
		return nil, err
	}
	defer base.freeBuffers()
	read0 := tier.Stats()
	next := make([]int, cfg.Clients)
	for i := range next {
		next[i] = i * blocks / cfg.Clients
	}
	// A disk's rate drifts within seconds (a virtual disk's most of
	// all): each round alternates slices of plain reads and promotes, so
	// the drift hits both alike.
	nSlices := max(int(cfg.Duration/diskSlice), 1)
	slice := cfg.Duration / time.Duration(nSlices)
	for r := range cfg.Rounds {
		var rb meter
		var m measurement
		sharedRead := func() error {
			return dev.during(&sharedIO, func() error { return base.read(&rb, cfg.Clients, slice/4, base.shared) })
		}
		privateRead := func() error {
			return dev.during(&privateIO, func() error { return base.read(&privateTotal, cfg.Clients, slice/4, base.private) })
		}
		for range nSlices {
			if err := errors.Join(sharedRead(), privateRead()); err != nil {
				return nil, err
			}
			err := dev.during(&promoteIO, func() error {
				sm, err := promote(ctx, c, st, tenant, namespace, keys, next, cfg.Clients, cfg.BlockBytes, slice)
				m.add(sm)
				return err
			})
			if err != nil {
				return nil, err
			}
			if err := errors.Join(privateRead(), sharedRead()); err != nil {
				return nil, err
			}
		}
		total.add(m)
		baseTotal.bytes += rb.bytes
		baseTotal.elapsed += rb.elapsed
		cfg.Progress.Phase(fmt.Sprintf("promote round %d", r+1), float64(r+1)/float64(cfg.Rounds), m.gbps())
		if cfg.Rounds > 1 {
			res.Rounds = append(res.Rounds, DiskRound{PromoteGBps: m.gbps(), ReadBaselineGBps: rb.gbps(), Ratio: m.gbps() / rb.gbps()})
		}
	}
	slices.Sort(total.lat)
	if read := tier.Stats(); read.Read > read0.Read {
		res.ReadMsPerPromote = (read.ReadSeconds - read0.ReadSeconds) * 1e3 / float64(read.Read-read0.Read)
	}
	res.PromoteGBps, res.ReadBaselineGBps = total.gbps(), baseTotal.gbps()
	res.PromoteRatio = res.PromoteGBps / res.ReadBaselineGBps
	res.ReadPrivateBaselineGBps = privateTotal.gbps()
	res.PromotePrivateRatio = res.PromoteGBps / res.ReadPrivateBaselineGBps
	res.Promotes = int64(len(total.lat))
	res.PromoteKiBPerRequest = promoteIO.kibPerRequest()
	res.ReadBaselineKiBPerRequest = sharedIO.kibPerRequest()
	res.ReadPrivateKiBPerRequest = privateIO.kibPerRequest()
	if len(total.lat) > 0 {
		res.P50Ms = ms(total.lat[len(total.lat)/2])
		res.P99Ms = ms(total.lat[min(len(total.lat)-1, len(total.lat)*99/100)])
	}
	return res, nil
}

// readOnce counts one read of a block in the store (its disk admission).
func readOnce(st *store.Store, tenant, namespace string, key []byte) error {
	p, err := st.Acquire([]byte(tenant), []byte(namespace), key)
	if err != nil {
		return fmt.Errorf("bench: read: %w", err)
	}
	st.Release(p)
	return nil
}

// diskSlice is how long a promote slice and its plain reads take.
const diskSlice = 250 * time.Millisecond

// promote runs clients clients for d, each fetching the
// next key of its cycle that memory lacks, and measures those fetches.
func promote(ctx context.Context, c *api.Client, st *store.Store, tenant, namespace string, keys [][]byte, next []int, clients, blockBytes int, d time.Duration) (measurement, error) {
	var total atomic.Int64
	lat := make([][]time.Duration, clients)
	errs := make([]error, clients)
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				k := keys[next[i]]
				next[i] = (next[i] + 1) % len(keys)
				if in, err := st.Exists([]byte(tenant), []byte(namespace), [][]byte{k}); err != nil || in[0] {
					continue // in memory: not a promote
				}
				begin := time.Now()
				out, err := c.Fetch(ctx, tenant, namespace, [][]byte{k}, 0)
				if err == nil {
					err = out[0].Err
				}
				if err != nil {
					errs[i] = fmt.Errorf("bench: fetch %s: %w", k, err)
					return
				}
				lat[i] = append(lat[i], time.Since(begin))
				total.Add(int64(blockBytes))
			}
		})
	}
	wg.Wait()
	m := measurement{meter: meter{bytes: total.Load(), elapsed: time.Since(start)}}
	for _, l := range lat {
		m.lat = append(m.lat, l...)
	}
	return m, errors.Join(errs...)
}

// fileBaseline is plain file I/O on the tier's disk: files of one size,
// written whole and read whole with one call each, with the tier's I/O
// mode.
type fileBaseline struct {
	dir    string
	direct bool
	size   int
	files  int
	next   atomic.Int64
	// sharedMem is the shared region reads rotate through; privateBufs
	// one private buffer per reader.
	sharedMem   []byte
	sharedNext  atomic.Int64
	privateBufs [][]byte
	frees       []func()
}

// setBuffers gives the reads their destinations.
func (b *fileBaseline) setBuffers(shared []byte, readers int) error {
	b.sharedMem = shared
	for range readers {
		buf, free, err := pageBuffer(b.size)
		if err != nil {
			return err
		}
		b.privateBufs = append(b.privateBufs, buf)
		b.frees = append(b.frees, free)
	}
	return nil
}

func (b *fileBaseline) freeBuffers() {
	for _, f := range b.frees {
		f()
	}
}

// shared is the next block's worth of the shared region.
func (b *fileBaseline) shared(int) []byte {
	slots := int64(len(b.sharedMem) / b.size)
	i := int((b.sharedNext.Add(1) - 1) % slots)
	return b.sharedMem[i*b.size : (i+1)*b.size]
}

// private is reader's own buffer.
func (b *fileBaseline) private(reader int) []byte { return b.privateBufs[reader] }

// sharedBuffer is size bytes of shared memory of the arena's kind, every
// page allocated: a memfd, or with the arena at segmentPath a file beside
// it (removed when freed).
func sharedBuffer(size int, segmentPath string) ([]byte, func(), error) {
	var fd int
	var err error
	name := ""
	if segmentPath == "" {
		fd, err = unix.MemfdCreate("kvpool-bench-disk", unix.MFD_CLOEXEC)
	} else {
		name = segmentPath + ".bench-baseline"
		fd, err = unix.Open(name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("bench: the baseline's shared memory: %w", err)
	}
	defer unix.Close(fd)
	remove := func() {
		if name != "" {
			os.Remove(name)
		}
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		remove()
		return nil, nil, fmt.Errorf("bench: size the baseline's shared memory: %w", err)
	}
	if err := unix.Fallocate(fd, 0, 0, int64(size)); err != nil {
		remove()
		return nil, nil, fmt.Errorf("bench: allocate the baseline's shared memory: %w", err)
	}
	buf, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		remove()
		return nil, nil, fmt.Errorf("bench: map the baseline's shared memory: %w", err)
	}
	return buf, func() { unix.Munmap(buf); remove() }, nil
}

func (b *fileBaseline) path(i int) string { return filepath.Join(b.dir, fmt.Sprintf("%06d", i)) }

func (b *fileBaseline) flags(f int) int {
	if b.direct {
		f |= unix.O_DIRECT
	}
	return f | unix.O_CLOEXEC
}

// pageBuffer is size bytes, page-aligned (direct I/O), off the heap.
func pageBuffer(size int) ([]byte, func(), error) {
	buf, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE|unix.MAP_POPULATE)
	if err != nil {
		return nil, nil, err
	}
	return buf, func() { unix.Munmap(buf) }, nil
}

// write writes files [from, to) with writers at once, and returns the
// bytes and the time taken.
func (b *fileBaseline) write(writers, from, to int) (int64, time.Duration, error) {
	var next atomic.Int64
	next.Store(int64(from))
	errs := make([]error, writers)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			buf, free, err := pageBuffer(b.size)
			if err != nil {
				errs[w] = err
				return
			}
			defer free()
			fillValue(buf, uint64(w))
			for i := int(next.Add(1) - 1); i < to; i = int(next.Add(1) - 1) {
				fd, err := unix.Open(b.path(i), b.flags(unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC), 0o600)
				if err == nil {
					_, err = unix.Pwrite(fd, buf, 0)
					if cerr := unix.Close(fd); err == nil {
						err = cerr
					}
				}
				if err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	return int64(to-from) * int64(b.size), time.Since(start), errors.Join(errs...)
}

// read reads files in sequence, readers at once, for d, adding to m;
// into says where each read lands.
func (b *fileBaseline) read(m *meter, readers int, d time.Duration, into func(reader int) []byte) error {
	return m.timed(nil, "plain reads", d, readers, func(reader int, deadline time.Time, total *atomic.Int64) error {
		for time.Now().Before(deadline) {
			i := int(b.next.Add(1)-1) % b.files
			fd, err := unix.Open(b.path(i), b.flags(unix.O_RDONLY), 0)
			if err != nil {
				return err
			}
			n, err := unix.Pread(fd, into(reader), 0)
			unix.Close(fd)
			if err != nil {
				return err
			}
			if n != b.size {
				return fmt.Errorf("plain read of %s: %d bytes, want %d", b.path(i), n, b.size)
			}
			total.Add(int64(n))
		}
		return nil
	})
}

// roundUp is n rounded up to 4 KiB, the unit of direct I/O.
func roundUp(n int64) int64 { return (n + 4095) &^ 4095 }

// Package bench measures a kvpool node's Get and Put throughput and
// latency, and in the same run the physical baseline the node must be
// judged against: raw TCP streams of the same block size and connection
// count for the socket paths, single-threaded memcpy of the same size for
// shared memory. The baseline runs in two halves, before and after the
// measured phase, so drift on a noisy machine hits both alike.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/wire"
	"github.com/kvpool/kvpool/pool"
)

// Config describes one benchmark run.
type Config struct {
	// Server is the node to measure; empty starts one in this process.
	Server string
	// Op is "get" or "put".
	Op string
	// Path is how clients move bytes: PathData (default), PathShm or
	// PathGRPC.
	Path api.Path
	// BlockBytes is the value size.
	BlockBytes int
	// Clients is the number of concurrent clients, each with its own
	// connection.
	Clients int
	// Duration is the measured phase of each round; the baseline takes as
	// long again.
	Duration time.Duration
	// Rounds repeats baseline-half, measure, baseline-half. Results sum
	// over all rounds; per-round ratios are reported too. Default 1.
	Rounds int
	// WorkingSetBytes is how much distinct block data Gets cycle through,
	// and the size of the region the baseline sends from; puts' blocks, and
	// the put baseline's frames, span as much (4 blocks per client at the
	// least, see putRing). Default 128 MiB.
	WorkingSetBytes int64
	// CapacityBytes sizes the in-process node. Default 4 GiB.
	CapacityBytes int64
	// SegmentPath, with Path shm, backs the in-process node's arena with a
	// file at this path (on a hugetlbfs mount: huge pages; the capacity
	// must then be a whole number of them, and free) and puts a Get's
	// memcpy baseline's region in a file beside it, shared memory of the
	// arena's kind, since copying into huge pages runs faster here than
	// into the heap's small pages (a Put's baseline copies into frames of
	// the arena itself, see memcpyBaseline). With Path data and no
	// Server, the same for the raw-TCP baseline's region, which plays the
	// arena the node receives puts into and sends gets from: a 2 MiB
	// receive into small pages
	// stalls for 5-8 ms once in a hundred on a paravirtualized host, and
	// one into huge pages does not (docs/benchmarks-history.md). With
	// Server set and Path shm, only a Get baseline's region goes
	// there: name the mount the node's arena is on. For RunRemote, both
	// nodes' arenas go there (the path with "-fetcher" and "-holder"
	// added) and so do the baselines' regions. Empty: memfd arenas and
	// baselines on the heap.
	SegmentPath string
	// NoBaseline skips the baseline.
	NoBaseline bool
	// NoLocationCache makes every shared-memory Get ask the node, instead
	// of copying blocks this client read before straight from the segment.
	NoLocationCache bool
	// NoShmMailbox keeps the shm sessions' round trips on their unix
	// sockets (api.ClientConfig.NoShmMailbox).
	NoShmMailbox bool
	// NoLocalServe has clients of the in-process node wait for its
	// goroutine to serve their posts, as clients in another process do,
	// instead of serving them themselves (api.ClientConfig.NoLocalServe).
	NoLocalServe bool
	// Batch, with Op put, is how many blocks each call stores: above 1,
	// each client calls PutMany with Batch distinct source buffers (an
	// engine saving a request's blocks), and the memcpy baseline copies
	// from as many. Default 1: Put.
	Batch int
	// WriteBehind, with Op put and no Batch, has each client put with
	// PutAsync (its commits answered while it copies the next block) and
	// Flush before its last put counts; the memcpy baseline copies into
	// as many frames more as the spares such a client holds beyond one
	// (api.WriteBehindSpares: four of 2 MiB blocks, two of 16 MiB).
	WriteBehind bool
	// ClientSpinWait is the clients' api.ClientConfig.SpinWait: how long
	// a call polls its socket for the node's response before parking.
	// Zero: the client's default; negative: off.
	ClientSpinWait time.Duration
	// NodeSpinWait is the in-process nodes' pool.Config.SpinWait. Zero:
	// the node's default; negative: off.
	NodeSpinWait time.Duration
	// TCPCongestion is the TCP congestion control of everything the run
	// sends over TCP: the in-process nodes' connections, the clients' and
	// the raw-TCP baselines', so a baseline moves bytes as kvpool's
	// connections do. With Server, name the node's (it sends Gets'
	// bytes). Default wire.DefaultCongestion; "host" keeps the host's.
	TCPCongestion string
	// Progress, when set, receives a progress bar.
	Progress *Progress
	// Tenant and Namespace hold the benchmark's blocks.
	Tenant, Namespace string
}

// Result is what a run measured. Field names are the JSON the CLI prints.
type Result struct {
	Op              string  `json:"op"`
	Path            string  `json:"path"`
	BlockBytes      int     `json:"block_bytes"`
	Clients         int     `json:"clients"`
	DurationS       float64 `json:"duration_s"`
	Ops             int64   `json:"ops"`
	GBps            float64 `json:"gbps"`
	OpsPerS         float64 `json:"ops_per_s"`
	P50Ms           float64 `json:"p50_ms"`
	P99Ms           float64 `json:"p99_ms"`
	Baseline        string  `json:"baseline"`
	BaselineGBps    float64 `json:"baseline_gbps"`
	RatioToBaseline float64 `json:"ratio_to_baseline"`
	Server          string  `json:"server"`
	// Threads is how many of the Go runtime's processors (GOMAXPROCS)
	// the bench's process ran its clients and its baseline on.
	Threads int `json:"threads"`
	// Floor, for fetches, is a second reference measured in the same
	// rounds: raw TCP over the same connections, asked for one chain's
	// bytes at a time, each chain read in full before the next is asked
	// for. It is what a zero-cost serial fetch would do; the streaming
	// baseline keeps every connection full and never waits on a round
	// trip, which no fetch of one chain after another can.
	Floor        string  `json:"floor,omitempty"`
	FloorGBps    float64 `json:"floor_gbps,omitempty"`
	RatioToFloor float64 `json:"ratio_to_floor,omitempty"`
	// Checked, over TCP, is a third reference measured in the same
	// rounds: the streaming baseline with the checksums kvpool's ends
	// must take (a block's CRC-32C is verified whenever its bytes cross
	// a process boundary), folded as kvpool folds them: the receiver over
	// each piece as it arrives, and for a put the sender over each value
	// on a second goroutine beside its write. It is the most a transfer
	// that keeps the checksums can move here; where the CPUs, not the
	// link, bound raw TCP, it is below the baseline.
	Checked        string  `json:"checked,omitempty"`
	CheckedGBps    float64 `json:"checked_gbps,omitempty"`
	RatioToChecked float64 `json:"ratio_to_checked,omitempty"`
	// Relayed, for fetches over TCP, is a fourth reference measured in
	// the same rounds: the floor with what kvpool's design adds to it,
	// nothing else. The measuring goroutine asks a relay for each chain
	// over a loopback connection of its own, as an engine asks its node;
	// the relay asks for the chain over the raw connections, checksums
	// it as it arrives, and answers when all of it is in. Where kvpool's
	// fetch comes close to it, what is left of the baseline goes to the
	// checksum and the engine's hop on this host.
	Relayed        string  `json:"relayed,omitempty"`
	RelayedGBps    float64 `json:"relayed_gbps,omitempty"`
	RatioToRelayed float64 `json:"ratio_to_relayed,omitempty"`
	// Rounds holds each round's own figures when there is more than one.
	Rounds []Round `json:"rounds,omitempty"`
}

// Round is one baseline-measure-baseline cycle.
type Round struct {
	GBps            float64 `json:"gbps"`
	BaselineGBps    float64 `json:"baseline_gbps"`
	RatioToBaseline float64 `json:"ratio_to_baseline"`
	FloorGBps       float64 `json:"floor_gbps,omitempty"`
	RatioToFloor    float64 `json:"ratio_to_floor,omitempty"`
	CheckedGBps     float64 `json:"checked_gbps,omitempty"`
	RatioToChecked  float64 `json:"ratio_to_checked,omitempty"`
	RelayedGBps     float64 `json:"relayed_gbps,omitempty"`
	RatioToRelayed  float64 `json:"ratio_to_relayed,omitempty"`
}

func (c *Config) fill() error {
	if c.Op != "get" && c.Op != "put" && c.Op != "fetch" {
		return fmt.Errorf("%w: op %q: want get or put", api.ErrInvalidArgument, c.Op)
	}
	if c.Path == api.PathAuto {
		c.Path = api.PathData
	}
	if c.BlockBytes <= 0 || c.Clients <= 0 || c.Duration <= 0 {
		return fmt.Errorf("%w: block size, clients and duration must be positive", api.ErrInvalidArgument)
	}
	if c.Rounds == 0 {
		c.Rounds = 1
	}
	if c.Batch == 0 {
		c.Batch = 1
	}
	if c.WriteBehind && (c.Op != "put" || c.Batch > 1) {
		return fmt.Errorf("%w: write-behind is for puts without a batch", api.ErrInvalidArgument)
	}
	if c.Batch < 1 || c.Batch > 1024 || c.Batch > 1 && c.Op != "put" {
		return fmt.Errorf("%w: batch %d: 1 to 1024 blocks, and only for puts", api.ErrInvalidArgument, c.Batch)
	}
	if c.WorkingSetBytes == 0 {
		c.WorkingSetBytes = 128 << 20
	}
	if c.CapacityBytes == 0 {
		c.CapacityBytes = 4 << 30
	}
	c.TCPCongestion = wire.CongestionOrDefault(c.TCPCongestion)
	if err := wire.ValidateCongestion(c.TCPCongestion); err != nil {
		return fmt.Errorf("%w: %v", api.ErrInvalidArgument, err)
	}
	if c.Tenant == "" {
		c.Tenant = "bench"
	}
	if c.Namespace == "" {
		c.Namespace = "bench"
	}
	return nil
}

// Run executes the benchmark.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	server := cfg.Server
	if server == "" {
		n, stop, err := startNode(cfg)
		if err != nil {
			return nil, err
		}
		defer stop()
		server = n.Addr().String()
	}
	clients := make([]*api.Client, cfg.Clients)
	for i := range clients {
		c, err := api.Dial(ctx, api.ClientConfig{Server: server, Path: cfg.Path, MaxIdleConns: 2, NoLocationCache: cfg.NoLocationCache, NoShmMailbox: cfg.NoShmMailbox, NoLocalServe: cfg.NoLocalServe, SpinWait: cfg.ClientSpinWait, TCPCongestion: cfg.TCPCongestion})
		if err != nil {
			return nil, err
		}
		defer c.Close()
		if c.Path() != cfg.Path {
			return nil, fmt.Errorf("%w: node does not offer path %v", api.ErrUnavailable, cfg.Path)
		}
		clients[i] = c
	}
	// Measure clients as engines run, long after their mapping of the
	// segment is done, not while it still takes the cores.
	for _, c := range clients {
		if err := c.WaitMapped(ctx); err != nil {
			return nil, err
		}
	}
	blocks := int(max(cfg.WorkingSetBytes/int64(cfg.BlockBytes), 1))
	keys := make([]api.BlockKey, blocks)
	for i := range keys {
		keys[i] = api.BlockKey{Tenant: cfg.Tenant, Namespace: cfg.Namespace, Key: fmt.Appendf(nil, "bench-%d-%d", cfg.BlockBytes, i)}
	}
	if cfg.Op == "get" {
		if err := populate(ctx, clients[0], keys, cfg.BlockBytes, cfg.Progress); err != nil {
			return nil, err
		}
	}
	res := &Result{Op: cfg.Op, Path: cfg.Path.String(), BlockBytes: cfg.BlockBytes, Clients: cfg.Clients, Server: cfg.Server, Threads: runtime.GOMAXPROCS(0)}
	if res.Server == "" {
		res.Server = "in-process"
	}
	var refs references
	if !cfg.NoBaseline {
		base, err := newBaseline(ctx, cfg, server, clients)
		if err != nil {
			return nil, err
		}
		defer base.close()
		refs.base = base
		res.Baseline = base.name()
		if tb, ok := base.(*tcpBaseline); ok {
			refs.checked = &checkedTCP{stream: tb}
			if cfg.Op == "put" {
				// Streaming never waits for an answer; a put does. The
				// floor says what the waiting costs raw TCP here.
				refs.floor = &tcpPutRoundTrips{stream: tb}
			}
		}
	}
	if err := runRounds(ctx, cfg, refs, res, func(r int) (measurement, error) {
		return measure(ctx, cfg, clients, keys, r)
	}); err != nil {
		return nil, err
	}
	if cfg.Op == "get" {
		for _, k := range keys {
			clients[0].Remove(ctx, k)
		}
	}
	return res, nil
}

// references are what a run measures kvpool against, each nil where the
// run has none: base is the physical limit the ratio is taken to, floor
// (Result.Floor), checked (Result.Checked) and relayed (Result.Relayed)
// further references.
type references struct {
	base, floor, checked, relayed baseline
}

// runRounds runs cfg.Rounds rounds of half of each reference, one
// measurement and the other halves, so drift hits all of them, and
// fills res with the totals, the ratios and (with more than one round)
// each round's figures.
func runRounds(ctx context.Context, cfg Config, refs references, res *Result, measureRound func(r int) (measurement, error)) error {
	var all []baseline
	for _, b := range []baseline{refs.base, refs.floor, refs.checked, refs.relayed} {
		if b != nil {
			all = append(all, b)
		}
	}
	runHalf := func(d time.Duration) error {
		for _, b := range all {
			if err := b.run(ctx, d, cfg.Progress); err != nil {
				return fmt.Errorf("%s: %w", b.name(), err)
			}
		}
		return nil
	}
	var total measurement
	for r := range cfg.Rounds {
		before := make(map[baseline]meter, len(all))
		for _, b := range all {
			before[b] = *b.totals()
		}
		// rate is what b moved in this round, 0 for no reference.
		rate := func(b baseline) float64 {
			if b == nil {
				return 0
			}
			now, was := b.totals(), before[b]
			return (&meter{bytes: now.bytes - was.bytes, elapsed: now.elapsed - was.elapsed}).gbps()
		}
		if err := runHalf(cfg.Duration / 2); err != nil {
			return err
		}
		m, err := measureRound(r)
		if err != nil {
			return err
		}
		total.add(m)
		if err := runHalf(cfg.Duration - cfg.Duration/2); err != nil {
			return err
		}
		round := Round{GBps: m.gbps(), BaselineGBps: rate(refs.base), FloorGBps: rate(refs.floor),
			CheckedGBps: rate(refs.checked), RelayedGBps: rate(refs.relayed)}
		round.RatioToBaseline = ratio(round.GBps, round.BaselineGBps)
		round.RatioToFloor = ratio(round.GBps, round.FloorGBps)
		round.RatioToChecked = ratio(round.GBps, round.CheckedGBps)
		round.RatioToRelayed = ratio(round.GBps, round.RelayedGBps)
		if cfg.Rounds > 1 {
			res.Rounds = append(res.Rounds, round)
		}
	}
	total.fill(res)
	if b := refs.base; b != nil {
		res.BaselineGBps = b.totals().gbps()
		res.RatioToBaseline = ratio(res.GBps, res.BaselineGBps)
	}
	if b := refs.floor; b != nil {
		res.Floor = b.name()
		res.FloorGBps = b.totals().gbps()
		res.RatioToFloor = ratio(res.GBps, res.FloorGBps)
	}
	if b := refs.checked; b != nil {
		res.Checked = b.name()
		res.CheckedGBps = b.totals().gbps()
		res.RatioToChecked = ratio(res.GBps, res.CheckedGBps)
	}
	if b := refs.relayed; b != nil {
		res.Relayed = b.name()
		res.RelayedGBps = b.totals().gbps()
		res.RatioToRelayed = ratio(res.GBps, res.RelayedGBps)
	}
	return nil
}

// ratio is a/b, 0 when b is.
func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

func startNode(cfg Config) (*pool.Node, func(), error) {
	return startNodeWith("bench", cfg, pool.SecurityConfig{})
}

// startNodeWith starts an in-process node id for cfg's path and block
// size, secured with sec; stop ends it.
func startNodeWith(id string, cfg Config, sec pool.SecurityConfig) (n *pool.Node, stop func(), err error) {
	pc := pool.DefaultConfig(id, cfg.CapacityBytes)
	pc.ListenAddr = "127.0.0.1:0"
	pc.ShmSocket = ""
	pc.DisableShm = cfg.Path != api.PathShm
	if !pc.DisableShm {
		pc.ShmSocket = fmt.Sprintf("/tmp/kvpool-bench-%d.sock", rand.Uint32())
	}
	pc.MaxBlockBytes = min(max(int64(cfg.BlockBytes), 64<<20), cfg.CapacityBytes)
	if cfg.Path == api.PathShm || cfg.Path == api.PathData {
		pc.SegmentPath = cfg.SegmentPath
	}
	pc.SecurityConfig = sec
	// Steady state from the first round: no put pays a page's first write.
	pc.Prefault = true
	if cfg.NodeSpinWait != 0 {
		pc.SpinWait = cfg.NodeSpinWait
	}
	pc.TCPCongestion = cfg.TCPCongestion
	n, err = pool.New(pc)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	<-n.Ready()
	return n, func() { cancel(); <-done; n.Close() }, nil
}

func populate(ctx context.Context, c *api.Client, keys []api.BlockKey, size int, p *Progress) error {
	v := make([]byte, size)
	for i, k := range keys {
		fillValue(v, uint64(i))
		if err := c.Put(ctx, k, v); err != nil {
			return fmt.Errorf("populate: %w", err)
		}
		p.Phase("populate", float64(i+1)/float64(len(keys)), 0)
	}
	return nil
}

func fillValue(v []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 1))
	for i := 0; i+8 <= len(v); i += 8 {
		x := r.Uint64()
		for j := range 8 {
			v[i+j] = byte(x >> (8 * j))
		}
	}
}

// measurement is what clients moved in some time, with every op's latency.
type measurement struct {
	meter
	lat []time.Duration
}

func (m *measurement) add(o measurement) {
	m.bytes += o.bytes
	m.elapsed += o.elapsed
	m.lat = append(m.lat, o.lat...)
}

func (m *measurement) fill(res *Result) {
	slices.Sort(m.lat)
	res.DurationS = m.elapsed.Seconds()
	res.Ops = int64(len(m.lat))
	res.GBps = m.gbps()
	res.OpsPerS = float64(len(m.lat)) / m.elapsed.Seconds()
	if len(m.lat) > 0 {
		res.P50Ms = ms(m.lat[len(m.lat)/2])
		res.P99Ms = ms(m.lat[min(len(m.lat)-1, len(m.lat)*99/100)])
	}
}

// measure runs the clients for cfg.Duration. round keeps put keys of
// different rounds apart.
func measure(ctx context.Context, cfg Config, clients []*api.Client, keys []api.BlockKey, round int) (measurement, error) {
	var total atomic.Int64
	lat := make([][]time.Duration, len(clients))
	errs := make([]error, len(clients))
	bufs, sources := clientBuffers(cfg, len(clients), 1000)
	start := time.Now()
	deadline := start.Add(cfg.Duration)
	stopProgress := cfg.Progress.Run("measure", cfg.Duration, &total)
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() {
			buf, sources := bufs[i], sources[i]
			rng := rand.New(rand.NewPCG(uint64(i), 3))
			// Put keeps the arena from filling the way eviction would: once
			// a client holds keep+batch blocks it removes its oldest batch
			// with one pipelined round trip, in its own loop and on its
			// clock, so its blocks (and the spare) span exactly the frames
			// the baseline copies into (see putRing). A helper goroutine
			// removing behind it let up to two batches more stay live
			// (88 frames where the baseline cycles among 65, measured),
			// and a wider span copies slower on this kind of host.
			keepBlocks, batch := putRing(cfg)
			var live [][]byte // this client's stored blocks, oldest first
			defer func() {
				if len(live) > 0 {
					c.RemoveMany(context.WithoutCancel(ctx), cfg.Tenant, cfg.Namespace, live)
				}
			}()
			stored := func(k []byte) error {
				if live = append(live, k); len(live) < keepBlocks+batch {
					return nil
				}
				_, err := c.RemoveMany(ctx, cfg.Tenant, cfg.Namespace, live[:batch])
				live = append(live[:0], live[batch:]...)
				return err
			}
			for seq := 0; time.Now().Before(deadline); seq++ {
				var err error
				t0 := time.Now()
				switch {
				case cfg.Op == "get":
					_, err = c.Get(ctx, keys[rng.IntN(len(keys))], buf)
				case cfg.Op == "put" && cfg.Batch > 1:
					keys := make([][]byte, len(sources))
					for j := range keys {
						keys[j] = fmt.Appendf(nil, "put-%d-%d-%d-%d", round, i, seq, j)
						sources[j][0], sources[j][1] = byte(seq), byte(seq>>8) // distinct bytes per key
					}
					var errs []error
					if errs, err = c.PutMany(ctx, cfg.Tenant, cfg.Namespace, keys, sources); err == nil {
						err = errors.Join(errs...)
					}
					for _, k := range keys {
						if err == nil {
							err = stored(k)
						}
					}
				case cfg.Op == "put":
					k := api.BlockKey{Tenant: cfg.Tenant, Namespace: cfg.Namespace, Key: fmt.Appendf(nil, "put-%d-%d-%d", round, i, seq)}
					buf[0], buf[1] = byte(seq), byte(seq>>8) // distinct bytes per key
					if cfg.WriteBehind {
						err = c.PutAsync(ctx, k, buf)
						if err == nil && !time.Now().Before(deadline) {
							err = c.Flush(ctx) // the last put counts once stored
						}
					} else {
						err = c.Put(ctx, k, buf)
					}
					if err == nil {
						err = stored(k.Key)
					}
				}
				if err != nil {
					errs[i] = err
					return
				}
				lat[i] = append(lat[i], time.Since(t0))
				total.Add(int64(cfg.BlockBytes) * int64(cfg.Batch))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	stopProgress()
	if err := errors.Join(errs...); err != nil {
		return measurement{}, err
	}
	return measurement{meter: meter{bytes: total.Load(), elapsed: elapsed}, lat: slices.Concat(lat...)}, nil
}

// clientBuffers makes and writes, before any clock starts, each of n
// clients' buffer of BlockBytes and its sourceBuffers, client i's seeded
// with seed+i: their first touch (page faults; tens of milliseconds for a
// batch of 16 MiB blocks) is no copy's cost.
func clientBuffers(cfg Config, n int, seed uint64) (bufs [][]byte, sources [][][]byte) {
	for i := range n {
		buf := make([]byte, cfg.BlockBytes)
		fillValue(buf, seed+uint64(i))
		bufs = append(bufs, buf)
		sources = append(sources, sourceBuffers(cfg, seed+uint64(i)))
	}
	return bufs, sources
}

// putRing is how many of its blocks each client of a put keeps (keep) and
// how many it removes at a time (batch). A client's blocks cycle through
// keep+batch frames, its share of the working set, and through one more,
// the reservation it holds for its next put; the put baseline copies into
// as many. The span must match: on a paravirtualized host, copies into
// 2 MiB pages cycled among 64 ran at 37 GB/s, among 128 at 30, among 512
// at 22-25 (measured, one thread). A batch is half the frames or 64 MiB
// of blocks (8 at the least), whichever is fewer: one pipelined round trip
// of removes per batch, far less than the eviction it stands for.
func putRing(cfg Config) (keep, batch int) {
	frames := max(4, int(cfg.WorkingSetBytes/int64(cfg.BlockBytes))/cfg.Clients)
	batch = min(frames/2, max(8, int((64<<20)/int64(cfg.BlockBytes))))
	return frames - batch, batch
}

// clientFrame is the k-th of the frames client i of clients owns among
// frames: the clients take turns around them, and none owns one another
// does (with fewer frames than clients, some share).
func clientFrame(i, k, clients, frames int) int {
	mine := max(1, frames/clients)
	return (i%frames + (k%mine)*clients) % frames
}

// sourceBuffers are the Batch distinct values a client of a batched put
// sends each call, nil without a batch.
func sourceBuffers(cfg Config, seed uint64) [][]byte {
	if cfg.Batch <= 1 {
		return nil
	}
	bufs := make([][]byte, cfg.Batch)
	for j := range bufs {
		bufs[j] = make([]byte, cfg.BlockBytes)
		fillValue(bufs[j], seed<<16+uint64(j))
	}
	return bufs
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// baseline is a physical limit measured over the same duration and
// concurrency as the benchmark.
type baseline interface {
	name() string
	run(ctx context.Context, d time.Duration, p *Progress) error
	totals() *meter
	close()
}

func newBaseline(ctx context.Context, cfg Config, server string, clients []*api.Client) (baseline, error) {
	switch {
	case cfg.Path == api.PathShm:
		return &memcpyBaseline{cfg: cfg, clients: clients}, nil
	case cfg.Server != "":
		return &linkBaseline{cfg: cfg, server: server}, nil
	default:
		return newTCPBaseline(cfg)
	}
}

type meter struct {
	bytes   int64
	elapsed time.Duration
}

func (m *meter) totals() *meter { return m }

// timed runs body once per client, in parallel, for d, and adds the bytes
// they report through total to m. body stops when deadline has passed.
func (m *meter) timed(p *Progress, phase string, d time.Duration, clients int, body func(i int, deadline time.Time, total *atomic.Int64) error) error {
	var total atomic.Int64
	stop := p.Run(phase, d, &total)
	defer stop()
	start := time.Now()
	deadline := start.Add(d)
	errs := make([]error, clients)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() { errs[i] = body(i, deadline, &total) })
	}
	wg.Wait()
	m.bytes += total.Load()
	m.elapsed += time.Since(start)
	return errors.Join(errs...)
}

func (m *meter) gbps() float64 {
	if m.elapsed == 0 {
		return 0
	}
	return float64(m.bytes) / m.elapsed.Seconds() / 1e9
}

// tcpBaseline streams BlockBytes frames over Clients loopback TCP
// connections in this process: the sender writes each frame from a region
// the size of the working set, as the node writes from its arena, and the
// receiver reads each into one buffer, as a client does.
type tcpBaseline struct {
	cfg  Config
	ln   net.Listener
	src  []byte
	dst  []byte     // a second region, for fetch: one arena into another
	free []func()   // unmap src and dst when they are shared memory
	mu   sync.Mutex // serializes pair
	meter
}

// newTCPBaseline makes the baseline's regions on the heap or, with
// cfg.SegmentPath set (the nodes' arenas there), in shared memory beside
// the arenas, of their kind.
func newTCPBaseline(cfg Config) (*tcpBaseline, error) {
	size := int(max(cfg.WorkingSetBytes, int64(cfg.BlockBytes)))
	b := &tcpBaseline{cfg: cfg}
	region := func(name string) ([]byte, error) {
		mem, free, err := baselineRegion(size, cfg.SegmentPath, name)
		if free != nil {
			b.free = append(b.free, free)
		}
		return mem, err
	}
	var err error
	if b.src, err = region("src"); err != nil {
		return nil, err
	}
	if cfg.Op == "fetch" {
		if b.dst, err = region("dst"); err != nil {
			b.close()
			return nil, err
		}
	}
	fillValue(b.src, 99)
	if b.ln, err = listenTCP(cfg.TCPCongestion); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

func (b *tcpBaseline) name() string {
	if b.cfg.SegmentPath != "" && b.cfg.Op != "fetch" {
		return "raw-tcp (shared memory beside " + b.cfg.SegmentPath + ")"
	}
	return "raw-tcp" // RunRemote names where a fetch's regions are
}

// listenTCP listens on a free loopback port whose connections run
// congestion control algo from their first packet, as a node's do.
func listenTCP(algo string) (net.Listener, error) {
	lc := net.ListenConfig{Control: wire.CongestionControl(algo)}
	return lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
}

// dialTCP connects to addr with congestion control algo from the first
// packet, as kvpool's clients and transports do.
func dialTCP(addr, algo string) (net.Conn, error) {
	d := net.Dialer{Control: wire.CongestionControl(algo)}
	return d.Dial("tcp", addr)
}

// pair returns both ends of one loopback connection. Dial and accept run
// under a lock so that concurrent clients never get each other's ends.
func (b *tcpBaseline) pair() (client, server net.Conn, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return acceptDialed(b.ln, b.cfg.TCPCongestion)
}

// acceptDialed dials ln with congestion control algo and accepts the
// connection: both ends of it. The caller serializes calls on one
// listener, or the ends of two connections may cross.
func acceptDialed(ln net.Listener, algo string) (client, server net.Conn, err error) {
	if client, err = dialTCP(ln.Addr().String(), algo); err != nil {
		return nil, nil, err
	}
	if server, err = ln.Accept(); err != nil {
		client.Close()
		return nil, nil, err
	}
	return client, server, nil
}
func (b *tcpBaseline) close() {
	if b.ln != nil {
		b.ln.Close()
	}
	for _, free := range b.free {
		free()
	}
	b.free = nil
}

func (b *tcpBaseline) run(ctx context.Context, d time.Duration, p *Progress) error {
	return b.stream(&b.meter, false, d, p)
}

// stream sends BlockBytes frames over each client's connection for d and
// adds what arrived to m. With checked, the ends checksum what they move
// as kvpool's do (checkedTCP).
func (b *tcpBaseline) stream(m *meter, checked bool, d time.Duration, p *Progress) error {
	size := b.cfg.BlockBytes
	frames := len(b.src) / size
	phase := "baseline raw tcp"
	if checked {
		phase = "checked raw tcp"
	}
	return m.timed(p, phase, d, b.cfg.Clients, func(i int, deadline time.Time, total *atomic.Int64) error {
		cli, sc, err := b.pair()
		if err != nil {
			return err
		}
		defer cli.Close()
		defer sc.Close()
		sender, receiver := sc, cli
		if b.cfg.Op == "put" || b.cfg.Op == "fetch" {
			sender, receiver = cli, sc
		}
		// Mirror the node's memory traffic: a get sends from the arena
		// into the caller's buffer, a put from the caller's buffer into
		// the arena, a fetch from one arena into another. The working-set
		// region plays the arenas.
		one := make([]byte, size)
		fillValue(one, uint64(i))
		// Each connection sends from and receives into frames of its
		// own: the clients take turns around the working set, and none
		// reads or writes where another does. (Connections sending the
		// same frames at the same time would read them from each
		// other's cache, which no node's clients do.)
		frame := func(f int) int { return clientFrame(i, f, b.cfg.Clients, frames) * size }
		// A put's sender checksums each value it sends (a get's and a
		// fetch's sender holds the block's checksum already), on a
		// second goroutine beside the write, as api's putOver does.
		sum := checked && b.cfg.Op == "put"
		done := make(chan struct{})
		go func() {
			defer close(done)
			for f := 0; ; f++ {
				src := one
				if b.cfg.Op == "get" || b.cfg.Op == "fetch" {
					off := frame(f)
					src = b.src[off : off+size]
				}
				var crc chan uint32
				if sum {
					crc = make(chan uint32, 1)
					go func() { crc <- api.Checksum(src) }()
				}
				_, err := sender.Write(src)
				if sum {
					<-crc
				}
				if err != nil {
					return
				}
			}
		}()
		var rerr error
		for f := 0; time.Now().Before(deadline); f++ {
			dst := one
			off := frame(f)
			switch b.cfg.Op {
			case "put":
				dst = b.src[off : off+size]
			case "fetch":
				dst = b.dst[off : off+size]
			}
			// Read in the same pieces the node and client use
			// (api.RecvChunkBytes): the fastest way to drain a socket
			// here, so the baseline is as strong as raw TCP gets.
			if err := readPieces(receiver, dst, checked); err != nil {
				if time.Now().Before(deadline) {
					rerr = err
				}
				break
			}
			total.Add(int64(size))
		}
		receiver.Close()
		sender.Close()
		<-done
		return rerr
	})
}

// checkedTCP is the streaming baseline with the checksums kvpool's ends
// take (Result.Checked). It shares the baseline's listener and regions.
type checkedTCP struct {
	stream *tcpBaseline
	meter
}

func (c *checkedTCP) name() string {
	if c.stream.cfg.Op == "put" {
		return "raw-tcp, each value checksummed as it is sent and as it arrives"
	}
	return "raw-tcp, each block checksummed as it arrives"
}

func (c *checkedTCP) run(_ context.Context, d time.Duration, p *Progress) error {
	return c.stream.stream(&c.meter, true, d, p)
}

func (c *checkedTCP) close() {} // the stream's to close

// readPieces fills dst from r in reads of at most api.RecvChunkBytes;
// with checksum, it folds each piece into dst's CRC-32C as it arrives, as
// kvpool's receivers verify a block (api.ChecksumArrived).
func readPieces(r io.Reader, dst []byte, checksum bool) error {
	var crc uint32
	for off := 0; off < len(dst); {
		k, err := r.Read(dst[off:min(off+api.RecvChunkBytes, len(dst))])
		if checksum {
			crc = api.ChecksumArrived(crc, dst, off, off+k)
		}
		off += k
		if err != nil && off < len(dst) {
			return err
		}
	}
	_ = crc // only the work is wanted
	return nil
}

// linkBaseline measures a remote node's link with the data channel's
// source and sink ops: frames of BlockBytes with no index or arena work.
type linkBaseline struct {
	cfg    Config
	server string
	meter
}

func (b *linkBaseline) name() string { return "link-source-sink" }
func (b *linkBaseline) close()       {}

func (b *linkBaseline) run(ctx context.Context, d time.Duration, p *Progress) error {
	op := wire.OpSource
	if b.cfg.Op == "put" {
		op = wire.OpSink
	}
	return b.timed(p, "baseline link", d, b.cfg.Clients, func(_ int, deadline time.Time, total *atomic.Int64) error {
		c, err := dialTCP(b.server, b.cfg.TCPCongestion)
		if err != nil {
			return err
		}
		defer c.Close()
		if _, err := c.Write(wire.Preamble[:]); err != nil {
			return err
		}
		buf := make([]byte, b.cfg.BlockBytes)
		req := wire.AppendRequest(nil, &wire.Request{Op: op, ValueLen: uint64(b.cfg.BlockBytes)})
		var resp wire.Response
		for time.Now().Before(deadline) {
			if _, err := c.Write(req); err != nil {
				return err
			}
			if op == wire.OpSink {
				if _, err := c.Write(buf); err != nil {
					return err
				}
			}
			if err := wire.ReadResponse(c, &resp); err != nil {
				return err
			}
			if op == wire.OpSource {
				if err := readPieces(c, buf, false); err != nil {
					return err
				}
			}
			total.Add(int64(b.cfg.BlockBytes))
		}
		return nil
	})
}

// baselineRegion is size bytes of a baseline's memory: on the heap (free
// nil) when segmentPath is "", else shared memory of the arena's kind in
// a file beside it (segmentPath, with "-"+name when name is set), which
// free unmaps and removes.
func baselineRegion(size int, segmentPath, name string) (mem []byte, free func(), err error) {
	if segmentPath == "" {
		return make([]byte, size), nil, nil
	}
	if name != "" {
		segmentPath += "-" + name
	}
	return sharedBuffer(size, segmentPath)
}

// memcpyBaseline copies BlockBytes at a time with Clients goroutines,
// between one buffer per goroutine (the engine's, hot) and frames of the
// working set's size: for a Get, from random frames of a region into the
// buffer, what a same-host Get must do at the least; the region is where
// the node's arena is, memory the copy finds out of cache once the working
// set exceeds the last-level cache, as an arena of many GiB is. For a Put,
// from the buffer into random frames each client reserved in the node's
// arena (the Reserve an engine DMAs through, aborted after), as many as
// its puts cycle through (putRing): what a same-host Put must do at the
// least, into the very memory its puts are handed. On a paravirtualized
// host a copy's speed depends on which pages it writes and on how many it
// cycles through, by up to half, so a region of the baseline's own, or a
// different span, would measure the memory rather than the put.
type memcpyBaseline struct {
	cfg        Config
	clients    []*api.Client // a Put's, to reserve frames through
	region     []byte
	freeRegion func()     // unmaps a region of shared memory; nil for the heap's
	bufs       [][]byte   // each client's buffer
	sources    [][][]byte // each client's batch of buffers (sourceBuffers)
	rounds     int        // runs so far, to name each run's reservations apart
	meter
}

func (b *memcpyBaseline) name() string {
	if b.cfg.Op == "put" {
		return "memcpy into frames reserved in the node's arena"
	}
	if b.cfg.SegmentPath != "" {
		return "memcpy (shared memory beside " + b.cfg.SegmentPath + ")"
	}
	return "memcpy"
}

func (b *memcpyBaseline) close() {
	if b.freeRegion != nil {
		b.freeRegion()
		b.region, b.freeRegion = nil, nil
	}
}

func (b *memcpyBaseline) run(ctx context.Context, d time.Duration, p *Progress) error {
	if b.cfg.Op == "put" {
		return b.runPut(ctx, d, p)
	}
	if b.region == nil {
		var err error
		size := int(max(b.cfg.WorkingSetBytes, int64(b.cfg.BlockBytes)))
		if b.region, b.freeRegion, err = baselineRegion(size, b.cfg.SegmentPath, ""); err != nil {
			return err
		}
		fillValue(b.region, 5)
	}
	size := b.cfg.BlockBytes
	frames := len(b.region) / size
	if b.bufs == nil {
		b.bufs, b.sources = clientBuffers(b.cfg, b.cfg.Clients, 0)
	}
	return b.timed(p, "baseline memcpy", d, b.cfg.Clients, func(i int, deadline time.Time, total *atomic.Int64) error {
		buf := b.bufs[i]
		rng := rand.New(rand.NewPCG(uint64(i), 9))
		// Each client copies from frames of its own, at random among
		// them, as the put baseline's clients copy into theirs.
		mine := max(1, frames/b.cfg.Clients)
		for deadline.After(time.Now()) {
			off := clientFrame(i, rng.IntN(mine), b.cfg.Clients, frames) * size
			copy(buf, b.region[off:off+size])
			total.Add(int64(size))
		}
		return nil
	})
}

// runPut reserves, through each client's own connection, as many frames
// of the node's arena as that client's puts cycle through (putRing, and
// the spare), copies into them at random for d, and aborts them all.
func (b *memcpyBaseline) runPut(ctx context.Context, d time.Duration, p *Progress) error {
	size := b.cfg.BlockBytes
	keep, batch := putRing(b.cfg)
	mine := keep + batch + 1
	if b.cfg.WriteBehind {
		mine += api.WriteBehindSpares(size) - 1
	}
	if b.bufs == nil {
		b.bufs, b.sources = clientBuffers(b.cfg, b.cfg.Clients, 0)
	}
	b.rounds++
	frames := make([][]*api.Reservation, len(b.clients))
	defer func() {
		for _, rs := range frames {
			for _, r := range rs {
				r.Abort()
			}
		}
	}()
	for i, c := range b.clients {
		for k := range mine {
			key := api.BlockKey{Tenant: b.cfg.Tenant, Namespace: b.cfg.Namespace, Key: fmt.Appendf(nil, "baseline-%d-%d-%d", b.rounds, i, k)}
			r, err := c.Reserve(ctx, key, size)
			if err != nil {
				return fmt.Errorf("reserving the baseline's frames in the arena: %w", err)
			}
			frames[i] = append(frames[i], r)
		}
	}
	return b.timed(p, "baseline memcpy", d, b.cfg.Clients, func(i int, deadline time.Time, total *atomic.Int64) error {
		buf, sources, mem := b.bufs[i], b.sources[i], frames[i]
		rng := rand.New(rand.NewPCG(uint64(i), 9))
		for n := 0; deadline.After(time.Now()); n++ {
			if len(sources) > 0 {
				buf = sources[n%len(sources)]
			}
			copy(mem[rng.IntN(len(mem))].Bytes(), buf)
			total.Add(int64(size))
		}
		return nil
	})
}

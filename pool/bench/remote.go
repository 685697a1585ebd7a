package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/metadata"
	"github.com/kvpool/kvpool/pool"
	"github.com/kvpool/kvpool/transfer"
)

// RemoteConfig adds to Config what --remote needs.
type RemoteConfig struct {
	// Transport is how the fetching node pulls: tcp, grpc or shm. Default
	// tcp.
	Transport transfer.Protocol
	// Conns is the tcp transport's connections per peer; the raw-TCP
	// baseline uses as many.
	Conns int
	// ServeSendBufferBytes is both nodes'
	// pool.TransferConfig.ServeSendBufferBytes (0: its default; negative:
	// the kernel's autotuning). The baselines' sockets keep the kernel's.
	ServeSendBufferBytes int64
	// ChainBlocks is how many blocks one Fetch asks for.
	ChainBlocks int
	// EtcdEndpoints is the etcd the two nodes meet in (the CLI starts an
	// embedded one). Required.
	EtcdEndpoints []string
}

// RunRemote starts two nodes in this process on rc's etcd, stores
// blocks on node B, and measures node A fetching them (pin on B, one-sided
// reads into A's arena, checksum, commit as a replica): each client asks
// A to Fetch a chain of ChainBlocks blocks, then drops A's copies so the
// next fetch moves bytes again. The baseline is raw TCP with as many
// connections as the transport keeps per peer, streaming from one region
// into another as big as the working set.
func RunRemote(ctx context.Context, cfg Config, rc RemoteConfig) (*Result, error) {
	cfg.Op = "fetch"
	if cfg.Path == api.PathAuto {
		cfg.Path = api.PathData
	}
	if err := fillRemote(&cfg, &rc); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kvpool-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var nodes []*pool.Node
	for _, id := range []string{"fetcher", "holder"} {
		cli, err := metadata.NewClient(rc.EtcdEndpoints)
		if err != nil {
			return nil, err
		}
		defer cli.Close()
		pc := pool.DefaultConfig(id, cfg.CapacityBytes)
		pc.ListenAddr, pc.ShmSocket, pc.DisableShm = "127.0.0.1:0", "", true
		if rc.Transport == transfer.ProtocolSHM {
			// Both nodes on this host: the fetcher maps the holder's arena.
			pc.ShmSocket, pc.DisableShm = filepath.Join(dir, id+".sock"), false
		}
		pc.MaxBlockBytes = min(max(int64(cfg.BlockBytes), 64<<20), cfg.CapacityBytes)
		if cfg.SegmentPath != "" {
			pc.SegmentPath = cfg.SegmentPath + "-" + id
		}
		pc.Etcd, pc.LeaseTTL = cli, 5*time.Second
		pc.Transport, pc.TransferConns = rc.Transport, rc.Conns
		pc.ServeSendBufferBytes = rc.ServeSendBufferBytes
		pc.FetchTimeout = 30 * time.Second
		// Steady state from the first round: no fetch pays the first
		// write of its reservation's pages.
		pc.Prefault = true
		if cfg.NodeSpinWait != 0 {
			pc.SpinWait = cfg.NodeSpinWait
		}
		pc.TCPCongestion = cfg.TCPCongestion
		n, err := pool.New(pc)
		if err != nil {
			return nil, err
		}
		rctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- n.Run(rctx) }()
		defer func() { cancel(); <-done; n.Close() }()
		<-n.Ready()
		nodes = append(nodes, n)
	}
	fetcher, holder := nodes[0], nodes[1]
	hc, err := api.Dial(ctx, api.ClientConfig{Server: holder.Addr().String(), Path: api.PathData, TCPCongestion: cfg.TCPCongestion})
	if err != nil {
		return nil, err
	}
	defer hc.Close()
	blocks := int(max(cfg.WorkingSetBytes/int64(cfg.BlockBytes), int64(rc.ChainBlocks)))
	blocks -= blocks % rc.ChainBlocks
	keys := make([][]byte, blocks)
	bk := make([]api.BlockKey, blocks)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "remote-%d-%d", cfg.BlockBytes, i)
		bk[i] = api.BlockKey{Tenant: cfg.Tenant, Namespace: cfg.Namespace, Key: keys[i]}
	}
	if err := populate(ctx, hc, bk, cfg.BlockBytes, cfg.Progress); err != nil {
		return nil, err
	}
	// Wait until the fetcher's mirror knows where every block is.
	for deadline := time.Now().Add(30 * time.Second); ; {
		if r := fetcher.Mirror().Locate(cfg.Tenant, cfg.Namespace, keys); r.PoolPrefix == len(keys) {
			break
		}
		if time.Now().After(deadline) {
			return nil, errors.New("bench: the fetcher's mirror never learned where the blocks are")
		}
		time.Sleep(5 * time.Millisecond)
	}
	clients := make([]*api.Client, cfg.Clients)
	for i := range clients {
		if clients[i], err = api.Dial(ctx, api.ClientConfig{Server: fetcher.Addr().String(), Path: api.PathData, TCPCongestion: cfg.TCPCongestion}); err != nil {
			return nil, err
		}
		defer clients[i].Close()
	}
	res := &Result{Op: "fetch", Path: rc.Transport.String(), BlockBytes: cfg.BlockBytes, Clients: cfg.Clients, Server: "in-process, 2 nodes"}
	var refs references
	if !cfg.NoBaseline {
		bc := cfg
		bc.Clients = rc.Conns
		if rc.Transport == transfer.ProtocolGRPC {
			bc.Clients = 1
		}
		if rc.Transport == transfer.ProtocolSHM {
			// The shm transport copies with two workers.
			bc.Clients = 2
			refs.base = &memcpyBaseline{cfg: bc}
			res.Baseline = "memcpy, 2 threads"
		} else {
			tb, err := newTCPBaseline(bc)
			if err != nil {
				return nil, err
			}
			defer tb.close()
			refs.base = tb
			res.Baseline = fmt.Sprintf("raw-tcp, %d connections", bc.Clients)
			if cfg.SegmentPath != "" {
				res.Baseline += ", between regions of shared memory beside " + cfg.SegmentPath
			}
			if rc.Transport == transfer.ProtocolTCP {
				rt, err := newTCPRoundTrips(bc, rc.ChainBlocks*cfg.BlockBytes, false, tb.src, tb.dst)
				if err != nil {
					return nil, err
				}
				defer rt.close()
				refs.floor = rt
				relayed, err := newTCPRoundTrips(bc, rc.ChainBlocks*cfg.BlockBytes, true, tb.src, tb.dst)
				if err != nil {
					return nil, err
				}
				defer relayed.close()
				refs.relayed = relayed
				refs.checked = &checkedTCP{stream: tb}
			}
		}
	}
	chains := len(keys) / rc.ChainBlocks
	var next atomic.Int64
	if err := runRounds(ctx, cfg, refs, res, func(int) (measurement, error) {
		return measureFetch(ctx, cfg, rc, clients, keys, chains, &next)
	}); err != nil {
		return nil, err
	}
	return res, nil
}

func fillRemote(cfg *Config, rc *RemoteConfig) error {
	if err := cfg.fill(); err != nil {
		return err
	}
	if rc.Transport == 0 {
		rc.Transport = transfer.ProtocolTCP
	}
	if len(rc.EtcdEndpoints) == 0 {
		return fmt.Errorf("%w: remote bench: no etcd endpoints", api.ErrInvalidArgument)
	}
	if rc.Conns <= 0 {
		rc.Conns = 2
	}
	if rc.ChainBlocks <= 0 {
		rc.ChainBlocks = 16
	}
	return nil
}

// measureFetch has each client fetch whole chains onto the fetcher and
// drop the copies again, for cfg.Duration. The rate is of the time spent
// in Fetch calls (each client's, averaged over the clients): the drop
// between two fetches is the benchmark's cleanup, not a fetch's cost.
func measureFetch(ctx context.Context, cfg Config, rc RemoteConfig, clients []*api.Client, keys [][]byte, chains int, next *atomic.Int64) (measurement, error) {
	var total atomic.Int64
	lat := make([][]time.Duration, len(clients))
	errs := make([]error, len(clients))
	start := time.Now()
	deadline := start.Add(cfg.Duration)
	stop := cfg.Progress.Run("measure fetch", cfg.Duration, &total)
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				ch := int(next.Add(1)) % chains
				chain := keys[ch*rc.ChainBlocks : (ch+1)*rc.ChainBlocks]
				t0 := time.Now()
				res, err := c.Fetch(ctx, cfg.Tenant, cfg.Namespace, chain, 0)
				if err == nil {
					for _, r := range res {
						if r.Err != nil {
							err = r.Err
							break
						}
					}
				}
				if err != nil {
					errs[i] = err
					return
				}
				lat[i] = append(lat[i], time.Since(t0))
				total.Add(int64(len(chain) * cfg.BlockBytes))
				// Drop the copies so the next fetch of this chain moves
				// bytes again.
				if _, err := c.RemoveMany(ctx, cfg.Tenant, cfg.Namespace, chain); err != nil {
					errs[i] = err
					return
				}
			}
		})
	}
	wg.Wait()
	stop()
	if err := errors.Join(errs...); err != nil {
		return measurement{}, err
	}
	var busy time.Duration
	for _, l := range lat {
		for _, d := range l {
			busy += d
		}
	}
	return measurement{meter: meter{bytes: total.Load(), elapsed: busy / time.Duration(len(clients))}, lat: slices.Concat(lat...)}, nil
}

// tcpRoundTrips is the floor of a serial fetch: one fetcher over raw TCP
// with the transport's connection count, asking for one chain's bytes at
// a time (a 16-byte request on each connection for its share, as the
// transport stripes a chain) and reading all of them before it asks for
// the next chain. No lookup, pin, checksum or commit: what a fetch with
// no cost of its own would take, round trips and all.
//
// Relayed, it is the floor of kvpool's design (Result.Relayed): the
// measuring goroutine, the engine, asks a relay for each chain over a
// loopback TCP connection of its own, as an engine asks its node; the
// relay asks for the chain as above, folds each piece into the block's
// CRC-32C as it arrives (DESIGN verifies a block wherever it crosses a
// process boundary) and answers when all of it is in. Still no lookup,
// pin, reservation or commit, and no spinning: every wait parks in Go's
// netpoller.
type tcpRoundTrips struct {
	conns      int
	chainBytes int
	relayed    bool
	congestion string // Config.TCPCongestion
	ln         net.Listener
	src, dst   []byte // the streaming baseline's regions, which it lends
	meter
}

func newTCPRoundTrips(cfg Config, chainBytes int, relayed bool, src, dst []byte) (*tcpRoundTrips, error) {
	if chainBytes > len(src) || chainBytes > len(dst) {
		return nil, fmt.Errorf("%w: a %d-byte chain is larger than the %d-byte working set", api.ErrInvalidArgument, chainBytes, len(src))
	}
	ln, err := listenTCP(cfg.TCPCongestion)
	if err != nil {
		return nil, err
	}
	return &tcpRoundTrips{conns: cfg.Clients, chainBytes: chainBytes, relayed: relayed, congestion: cfg.TCPCongestion, ln: ln, src: src, dst: dst}, nil
}

func (b *tcpRoundTrips) name() string {
	if b.relayed {
		return fmt.Sprintf("raw-tcp request/response, %d connections, asked for through a relay that checksums each chain as it arrives", b.conns)
	}
	return fmt.Sprintf("raw-tcp request/response, %d connections", b.conns)
}
func (b *tcpRoundTrips) close() { b.ln.Close() }

func (b *tcpRoundTrips) run(ctx context.Context, d time.Duration, p *Progress) error {
	phase := "floor request/response"
	if b.relayed {
		phase = "relayed floor"
	}
	return b.timed(p, phase, d, 1, func(_ int, deadline time.Time, total *atomic.Int64) error {
		clients := make([]net.Conn, b.conns)
		var served sync.WaitGroup
		defer served.Wait()
		for i := range clients {
			c, s, err := acceptDialed(b.ln, b.congestion)
			if err != nil {
				return err
			}
			defer c.Close()
			clients[i] = c
			served.Go(func() {
				defer s.Close()
				var req [16]byte
				for {
					if _, err := io.ReadFull(s, req[:]); err != nil {
						return
					}
					off, n := binary.LittleEndian.Uint64(req[:8]), binary.LittleEndian.Uint64(req[8:])
					if _, err := s.Write(b.src[off : off+n]); err != nil {
						return
					}
				}
			})
		}
		// The shares: the chain cut in as many contiguous pieces as there
		// are connections.
		share := (b.chainBytes + b.conns - 1) / b.conns
		chains := len(b.src) / b.chainBytes
		errs := make([]error, b.conns)
		// fetch asks for chain ch and reads all of it.
		fetch := func(ch int) error {
			base := (ch % chains) * b.chainBytes
			// part(i) is connection i's share, in the same place of dst
			// as of src.
			part := func(i int) (off int, dst []byte) {
				lo, hi := base+min(i*share, b.chainBytes), base+min((i+1)*share, b.chainBytes)
				return lo, b.dst[lo:hi]
			}
			for i, c := range clients {
				off, dst := part(i)
				var req [16]byte
				binary.LittleEndian.PutUint64(req[:8], uint64(off))
				binary.LittleEndian.PutUint64(req[8:], uint64(len(dst)))
				if _, err := c.Write(req[:]); err != nil {
					return err
				}
			}
			// Every connection but the last is read by a goroutine of its
			// own; the last by this one, which then waits for the others.
			var wg sync.WaitGroup
			for i, c := range clients[:len(clients)-1] {
				wg.Go(func() { _, dst := part(i); errs[i] = readPieces(c, dst, b.relayed) })
			}
			last := len(clients) - 1
			_, dst := part(last)
			errs[last] = readPieces(clients[last], dst, b.relayed)
			wg.Wait()
			return errors.Join(errs...)
		}
		if b.relayed {
			// The relay's error, stored before it hangs up (atomic: the
			// race detector sees no order in a socket's close).
			var relayErr atomic.Pointer[error]
			direct := fetch // the relay's; fetch becomes the engine's below
			engine, err := b.startRelay(&served, func(ch int) error {
				err := direct(ch)
				if err != nil {
					relayErr.Store(&err)
				}
				return err
			})
			if err != nil {
				return err
			}
			defer engine.Close()
			fetch = func(ch int) error {
				var msg [8]byte
				binary.LittleEndian.PutUint64(msg[:], uint64(ch))
				if _, err := engine.Write(msg[:]); err != nil {
					return err
				}
				if _, err := io.ReadFull(engine, msg[:]); err != nil {
					// The relay hung up: its own error says why, when
					// it has one.
					if p := relayErr.Load(); p != nil {
						return *p
					}
					return err
				}
				return nil
			}
		}
		for ch := 0; time.Now().Before(deadline); ch++ {
			if err := fetch(ch); err != nil {
				return err
			}
			total.Add(int64(b.chainBytes))
		}
		return nil
	})
}

// startRelay connects the engine's side of a relayed floor to a relay
// goroutine, counted in served, that calls fetch for each chain asked for
// and answers when it returns; the relay stops when the engine's
// connection, which the caller closes, does.
func (b *tcpRoundTrips) startRelay(served *sync.WaitGroup, fetch func(ch int) error) (engine net.Conn, err error) {
	engine, relay, err := acceptDialed(b.ln, b.congestion)
	if err != nil {
		return nil, err
	}
	served.Go(func() {
		defer relay.Close()
		var msg [8]byte
		for {
			if _, err := io.ReadFull(relay, msg[:]); err != nil {
				return
			}
			if err := fetch(int(binary.LittleEndian.Uint64(msg[:]))); err != nil {
				return
			}
			if _, err := relay.Write(msg[:]); err != nil {
				return
			}
		}
	})
	return engine, nil
}

package pool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/kvpool/kvpool/api"
	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
	"github.com/kvpool/kvpool/api/wire"
	"github.com/kvpool/kvpool/eviction"
	"github.com/kvpool/kvpool/metadata"
	"github.com/kvpool/kvpool/transfer"
)

// Node is one kvpool daemon: a Store and the servers in front of it.
//
// New opens the segment and binds every listener, so Addr is known at once
// and a busy port fails early; it starts no goroutines of its own (gossip's
// library starts its listeners when bound; Close stops them). Run serves until
// its context ends, then shuts down in order: stop accepting, let gRPC
// calls finish (GracefulStop, then Stop after ShutdownGrace), close data
// connections, and wait for every goroutine it started. Close releases the
// segment and the listeners; call it after Run returns (or instead of Run).
type Node struct {
	cfg      Config
	log      *slog.Logger
	seg      *segment
	versions *segment // see Store.versions; nil without shared memory
	store    *Store
	metrics  *metrics
	hostID   string
	cluster  *cluster // nil for a standalone node

	engineMu sync.Mutex
	engine   metadata.Load // the local engine's last ReportLoad

	// Tenant policies of a standalone node (with a cluster they live in
	// etcd).
	localMu       sync.Mutex
	localPolicies map[string]eviction.TenantConfig

	// Transfers: every transport serves the arena as arenaRegion to peers
	// (shm only with shared memory on); transport (tcp or grpc, per
	// Config.Transport) pulls from peers, and shmPull, when
	// Config.Transport is shm, from peers on this host.
	tcpT      *transfer.TCP
	grpcT     *transfer.GRPC
	shmT      *transfer.SHM // nil with DisableShm
	transport transfer.Transport
	shmPull   transfer.Transport // nil unless Config.Transport is shm
	links     *transfer.Links
	peers     peerConns

	tcpLis  net.Listener
	shmLis  *net.UnixListener
	xferLis *net.UnixListener // the shm transport's socket; nil with DisableShm
	httpLis net.Listener

	grpcSrv *grpc.Server
	health  *health.Server
	grpcLis *chanListener

	// conns tracks open data connections so shutdown can close them.
	connsMu sync.Mutex
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup // data-connection and helper goroutines

	ready     chan struct{}
	closeOnce sync.Once
	closeErr  error
}

// ShutdownGrace is how long Run lets in-flight gRPC calls finish.
const ShutdownGrace = 5 * time.Second

// New validates cfg, maps the segment and binds the listeners.
func New(cfg Config) (*Node, error) {
	cfg.fillDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	n := &Node{
		cfg:    cfg,
		log:    cfg.Logger.With("component", "pool", "node", cfg.NodeID),
		conns:  map[net.Conn]struct{}{},
		ready:  make(chan struct{}),
		hostID: api.HostID(),
	}
	seg, err := openSegment("kvpool-"+cfg.NodeID, cfg.SegmentPath, cfg.CapacityBytes, cfg.LockMemory)
	if err != nil {
		return nil, err
	}
	n.seg = seg
	var words []uint64
	if !cfg.DisableShm {
		pages := cfg.CapacityBytes / cfg.PageBytes
		if n.versions, err = openSegment("kvpool-"+cfg.NodeID+"-versions", "", (pages*8+4095)&^4095, false); err != nil {
			return nil, errors.Join(err, n.Close())
		}
		words = n.versions.words()[:pages]
	}
	n.store = newStore(&n.cfg, seg, words)
	if err := n.listen(); err != nil {
		return nil, errors.Join(err, n.Close())
	}
	if n.metrics, err = newMetrics(n); err != nil {
		return nil, errors.Join(err, n.Close())
	}
	n.links = transfer.NewLinks(cfg.Links)
	n.tcpT = transfer.NewTCP(transfer.TCPConfig{ConnsPerPeer: cfg.TransferConns, Logger: cfg.Logger})
	n.grpcT = transfer.NewGRPC(transfer.GRPCConfig{})
	n.tcpT.Register(arenaRegion, seg.mem)
	n.grpcT.Register(arenaRegion, seg.mem)
	n.transport = n.tcpT
	if cfg.Transport == "grpc" {
		n.transport = n.grpcT
	}
	if !cfg.DisableShm {
		n.shmT = transfer.NewSHM(transfer.SHMConfig{})
		if err := n.shmT.RegisterFile(arenaRegion, seg.file, 0, uint64(len(seg.mem))); err != nil {
			return nil, errors.Join(err, n.Close())
		}
		if cfg.Transport == "shm" {
			n.shmPull = n.shmT
		}
	}
	if cfg.WrapTransport != nil {
		n.transport = cfg.WrapTransport(n.transport)
		if n.shmPull != nil {
			n.shmPull = cfg.WrapTransport(n.shmPull)
		}
	}
	n.grpcSrv = grpc.NewServer(append(transfer.ServerOptions(),
		grpc.MaxRecvMsgSize(MaxBatchBytes+1<<20),
		grpc.MaxSendMsgSize(MaxBatchBytes+1<<20),
		grpc.ChainUnaryInterceptor(n.metrics.unaryInterceptor),
		grpc.ChainStreamInterceptor(n.metrics.streamInterceptor),
	)...)
	n.grpcT.RegisterServer(n.grpcSrv)
	if err := cfg.Registerer.Register(&linkCollector{n}); err != nil {
		return nil, errors.Join(err, n.Close())
	}
	if cfg.Etcd != nil {
		if n.cluster, err = newCluster(n); err != nil {
			return nil, errors.Join(err, n.Close())
		}
		if err := cfg.Registerer.Register(&clusterCollector{n.cluster}); err != nil {
			return nil, errors.Join(err, n.Close())
		}
	}
	kvpoolv1.RegisterKVPoolServiceServer(n.grpcSrv, &grpcService{n: n})
	kvpoolv1.RegisterAdminServiceServer(n.grpcSrv, &adminService{n: n})
	n.health = health.NewServer()
	healthpb.RegisterHealthServer(n.grpcSrv, n.health)
	reflection.Register(n.grpcSrv)
	return n, nil
}

func (n *Node) listen() error {
	var err error
	if n.tcpLis, err = net.Listen("tcp", n.cfg.ListenAddr); err != nil {
		return fmt.Errorf("pool: listen on %s: %w", n.cfg.ListenAddr, err)
	}
	n.grpcLis = newChanListener(n.tcpLis.Addr())
	if n.cfg.MetricsAddr != "" {
		if n.httpLis, err = net.Listen("tcp", n.cfg.MetricsAddr); err != nil {
			return fmt.Errorf("pool: listen for metrics on %s: %w", n.cfg.MetricsAddr, err)
		}
	}
	if !n.cfg.DisableShm {
		if n.shmLis, err = listenUnix(n.cfg.ShmSocket); err != nil {
			return err
		}
		if n.xferLis, err = listenUnix(n.cfg.transferSocket()); err != nil {
			return err
		}
	}
	return nil
}

// listenUnix binds a unix socket, replacing a stale socket file that no
// live process listens on.
func listenUnix(path string) (*net.UnixListener, error) {
	addr := &net.UnixAddr{Name: path, Net: "unix"}
	l, err := net.ListenUnix("unix", addr)
	if err != nil && errors.Is(err, syscall.EADDRINUSE) {
		if c, derr := net.DialTimeout("unix", path, time.Second); derr == nil {
			c.Close()
			return nil, fmt.Errorf("pool: shm socket %s is in use by a running node", path)
		}
		if rerr := os.Remove(path); rerr != nil {
			return nil, fmt.Errorf("pool: remove stale shm socket %s: %w", path, rerr)
		}
		l, err = net.ListenUnix("unix", addr)
	}
	if err != nil {
		return nil, fmt.Errorf("pool: listen on shm socket %s: %w", path, err)
	}
	l.SetUnlinkOnClose(true)
	return l, nil
}

// Addr is the address serving gRPC and the data channel.
func (n *Node) Addr() net.Addr { return n.tcpLis.Addr() }

// MetricsAddr is the address serving /metrics, or nil.
func (n *Node) MetricsAddr() net.Addr {
	if n.httpLis == nil {
		return nil
	}
	return n.httpLis.Addr()
}

// ShmSocket is the path of the shared-memory socket, or "".
func (n *Node) ShmSocket() string {
	if n.shmLis == nil {
		return ""
	}
	return n.cfg.ShmSocket
}

// Store returns the node's block store.
func (n *Node) Store() *Store { return n.store }

// Links returns the node's per-link estimates.
func (n *Node) Links() *transfer.Links { return n.links }

// ID returns the node id.
func (n *Node) ID() string { return n.cfg.NodeID }

// Ready is closed once Run is serving.
func (n *Node) Ready() <-chan struct{} { return n.ready }

// Run serves until ctx is done, then shuts down gracefully. It returns nil
// after a clean shutdown.
func (n *Node) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var g sync.WaitGroup
	errc := make(chan error, 8)
	start := func(name string, f func() error) {
		g.Go(func() {
			if err := f(); err != nil {
				errc <- fmt.Errorf("pool: %s: %w", name, err)
				cancel()
			}
		})
	}
	var httpSrv *http.Server
	if n.httpLis != nil {
		httpSrv = &http.Server{Handler: n.httpHandler(), ReadHeaderTimeout: 10 * time.Second}
		start("metrics server", func() error {
			if err := httpSrv.Serve(n.httpLis); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	start("grpc server", func() error {
		if err := n.grpcSrv.Serve(n.grpcLis); !errors.Is(err, grpc.ErrServerStopped) {
			return err
		}
		return nil
	})
	start("accept loop", func() error { return n.acceptTCP(ctx) })
	if n.shmLis != nil {
		start("shm accept loop", func() error { return n.acceptShm(ctx) })
		start("shm transfer server", func() error { return n.shmT.Serve(ctx, n.xferLis) })
	}
	start("reservation sweeper", func() error { n.sweep(ctx); return nil })
	if n.cluster != nil {
		n.cluster.run(ctx, start)
	}
	n.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	n.health.SetServingStatus(kvpoolv1.KVPoolService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	close(n.ready)
	n.log.Info("serving", "addr", n.Addr().String(), "shm_socket", n.ShmSocket(), "capacity_bytes", n.cfg.CapacityBytes,
		"page_bytes", n.cfg.PageBytes, "memory_locked", n.seg.locked)

	<-ctx.Done()
	n.health.Shutdown()
	// Stop accepting: closing the listeners ends the accept loops.
	n.tcpLis.Close()
	if n.shmLis != nil {
		n.shmLis.Close()
	}
	stopped := make(chan struct{})
	go func() { n.grpcSrv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(ShutdownGrace):
		n.grpcSrv.Stop()
		<-stopped
	}
	if httpSrv != nil {
		sctx, scancel := context.WithTimeout(context.Background(), ShutdownGrace)
		httpSrv.Shutdown(sctx)
		scancel()
	}
	n.closeConns()
	n.wg.Wait()
	g.Wait()
	close(errc)
	var errs []error
	for err := range errc {
		errs = append(errs, err)
	}
	n.log.Info("stopped")
	return errors.Join(errs...)
}

func (n *Node) sweep(ctx context.Context) {
	// Every second at most: expired blocks and leases go within a second
	// of their time.
	t := time.NewTicker(min(max(n.cfg.ReservationTimeout/4, 10*time.Millisecond), time.Second))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			now := n.cfg.Now()
			if k := n.store.ReclaimExpired(now); k > 0 {
				n.metrics.reclaimed.Add(float64(k))
				n.log.Warn("reclaimed expired reservations", "count", k)
			}
			n.store.Sweep(now)
		}
	}
}

// Close releases the listeners and the segment. It is idempotent. Call it
// after Run has returned.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		// Listeners may already be closed by Run; that error is moot.
		if n.tcpLis != nil {
			n.tcpLis.Close()
		}
		if n.httpLis != nil {
			n.httpLis.Close()
		}
		if n.shmLis != nil {
			n.shmLis.Close()
		}
		if n.xferLis != nil {
			n.xferLis.Close()
		}
		if n.cluster != nil {
			n.cluster.gossip.Shutdown()
		}
		if n.tcpT != nil {
			n.tcpT.Close()
			n.grpcT.Close()
		}
		if n.shmT != nil {
			n.shmT.Close()
		}
		n.peers.closeAll()
		if n.seg != nil {
			n.closeErr = n.seg.close()
		}
		if n.versions != nil {
			n.closeErr = errors.Join(n.closeErr, n.versions.close())
		}
	})
	return n.closeErr
}

func (n *Node) httpHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(n.cfg.Gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		select {
		case <-n.ready:
			io.WriteString(w, "ready\n")
		default:
			http.Error(w, "starting", http.StatusServiceUnavailable)
		}
	})
	return mux
}

// acceptTCP accepts connections on the shared port and sorts them: data
// connections open with wire.Preamble, everything else goes to gRPC.
//
// NB: grpcLis is closed by the gRPC server when it stops, not here, so
// that Serve returns nil rather than a listener error.
func (n *Node) acceptTCP(ctx context.Context) error {
	for {
		c, err := n.tcpLis.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		if !n.track(c) {
			c.Close()
			return nil
		}
		n.wg.Go(func() { n.sniff(ctx, c) })
	}
}

// sniff reads the first bytes of c and hands it to the right server.
func (n *Node) sniff(ctx context.Context, c net.Conn) {
	var first [len(wire.Preamble)]byte
	c.SetReadDeadline(time.Now().Add(n.cfg.IOTimeout))
	k, err := io.ReadFull(c, first[:4])
	if err != nil {
		n.untrack(c)
		c.Close()
		return
	}
	isData := bytes.Equal(first[:4], wire.Preamble[:4])
	isTransfer := bytes.Equal(first[:4], transfer.TCPPreamble[:4])
	if !isData && !isTransfer {
		// Not ours: gRPC owns it from here, replaying the bytes we read.
		c.SetReadDeadline(time.Time{})
		n.untrack(c)
		if !n.grpcLis.deliver(&prefixConn{Conn: c, prefix: first[:k]}) {
			c.Close()
		}
		return
	}
	if isTransfer {
		defer n.untrack(c)
		defer c.Close()
		if _, err := io.ReadFull(c, first[4:]); err != nil || first != transfer.TCPPreamble {
			return
		}
		c.SetReadDeadline(time.Time{})
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetNoDelay(true)
		}
		if err := n.tcpT.ServeConn(ctx, c); err != nil {
			n.log.Debug("transfer connection ended", "remote", remote(c), "err", err)
		}
		return
	}
	defer n.untrack(c)
	defer c.Close()
	if _, err := io.ReadFull(c, first[4:]); err != nil || first != wire.Preamble {
		n.log.Warn("data connection with a bad preamble", "remote", c.RemoteAddr().String())
		return
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	n.serveData(ctx, c, newSession())
}

func (n *Node) track(c net.Conn) bool {
	n.connsMu.Lock()
	defer n.connsMu.Unlock()
	if n.conns == nil {
		return false
	}
	n.conns[c] = struct{}{}
	return true
}

func (n *Node) untrack(c net.Conn) {
	n.connsMu.Lock()
	defer n.connsMu.Unlock()
	delete(n.conns, c)
}

func (n *Node) closeConns() {
	n.connsMu.Lock()
	defer n.connsMu.Unlock()
	for c := range n.conns {
		c.Close()
	}
	n.conns = nil
}

// chanListener is a net.Listener fed by acceptTCP with the connections
// that turned out to be gRPC.
type chanListener struct {
	addr   net.Addr
	conns  chan net.Conn
	done   chan struct{}
	closed sync.Once
}

func newChanListener(addr net.Addr) *chanListener {
	return &chanListener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *chanListener) deliver(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.closed.Do(func() { close(l.done) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return l.addr }

// prefixConn replays bytes already read from a connection.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		k := copy(p, c.prefix)
		c.prefix = c.prefix[k:]
		return k, nil
	}
	return c.Conn.Read(p)
}

package pool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/auth"
	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
	"github.com/kvpool/kvpool/api/wire"
	"github.com/kvpool/kvpool/metadata/engines"
	"github.com/kvpool/kvpool/pool/disk"
	"github.com/kvpool/kvpool/pool/store"
	"github.com/kvpool/kvpool/transfer"
)

// Node is one kvpool daemon: a Store and the doors in front of it, wired
// together. The doors' handlers live in their own files and see the rest
// of the node only through the small interfaces they declare: the KV and
// admin gRPC services (kvservice.go, adminservice.go), the data channel
// and the shm socket (dataserver.go), and the transfer endpoints (the
// transports' servers, routed by listen.go).
//
// New opens the segment and binds every listener, so Addr is known at once
// and a busy port fails early; it starts no goroutines of its own (gossip's
// library starts its listeners when bound; Close stops them). Run serves until
// its context ends, then shuts down in order: stop accepting, let gRPC
// calls finish (GracefulStop, then Stop after ShutdownGrace), close data
// connections, and wait for every goroutine it started. Close releases the
// segment and the listeners; call it after Run returns (or instead of Run).
type Node struct {
	cfg Config
	log *slog.Logger // scoped with the node's id; components add their name
	seg *segment
	// segMu orders the background population's calls on seg (populate.go)
	// before Close unmaps it: segClosed says it has.
	segMu     sync.Mutex
	segClosed bool
	versions  *segment // the store's version words (store.New); nil without shared memory
	store     *store.Store
	// disk is the disk tier behind the arena; nil without DiskDir.
	disk *disk.Tier
	// blocks is what the handlers read and write: the store, or the
	// store in front of the disk (tiers).
	blocks  blockStore
	metrics *metrics
	hostID  string
	cluster *cluster // nil for a standalone node
	engine  *engineLoad

	// Transfers: every transport serves the arena as arenaRegion to peers
	// (shm only with shared memory on); the fetcher pulls with the one
	// Config.Transport names.
	tcpT  *transfer.TCP
	grpcT *transfer.GRPC
	shmT  *transfer.SHM // nil with DisableShm
	links *transfer.Links
	// persist is the data directory's journal; nil without one.
	persist *persistence
	fetcher *fetcher
	planner *planner
	// engines follows this node's engines' KV events; nil without
	// PlanConfig.EngineEvents.
	engines *engines.Tracker
	// peerCaches is the copy of the peers' engines' GPU caches; nil
	// standalone.
	peerCaches *peerCaches
	// stopping closes when Run begins to shut down: the long streams to
	// peers end then, so GracefulStop need not wait them out.
	stopping chan struct{}
	data     *dataServer

	doors   doors
	gate    *gatekeeper // who may pass the doors
	grants  *grants     // what peers may touch through transports; nil when open
	grpcSrv *grpc.Server
	health  *health.Server

	// serving is Run's context for the services it runs: it ends when Run
	// begins to stop. Set before ready closes.
	serving context.Context
	drain   drainState

	ready     chan struct{}
	closeOnce sync.Once
	closeErr  error
}

// ShutdownGrace is how long Run lets in-flight gRPC calls finish.
const ShutdownGrace = 5 * time.Second

// New validates cfg, maps the segment, binds the listeners and wires the
// components together.
func New(cfg Config) (*Node, error) {
	congestionDefaulted := cfg.TCPCongestion == ""
	cfg.fillDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, ready: make(chan struct{}), stopping: make(chan struct{}), hostID: api.HostID(),
		drain: drainState{done: make(chan struct{})}}
	log := slog.New(newRateLimited(cfg.Logger.Handler(), time.Now, func() {
		if m := n.metrics; m != nil {
			m.logsDropped.Inc()
		}
	})).With("node", cfg.NodeID)
	n.log = log.With("component", "pool")
	if congestionDefaulted && cfg.TCPCongestion == wire.CongestionHost {
		n.log.Warn("TCP congestion control "+wire.DefaultCongestion+" is not available to this process; the connections run the host's default", "err", wire.ValidateCongestion(wire.DefaultCongestion))
	}
	var words []uint64
	var err error
	if !cfg.DisableShm {
		pages := cfg.CapacityBytes / cfg.PageBytes
		if n.versions, err = openSegment("kvpool-"+cfg.NodeID+"-versions", "", int64(wire.VersionSegmentBytes(uint64(pages))), false, false, false); err != nil {
			return nil, errors.Join(err, n.Close())
		}
		words = n.versions.words()[:pages]
	}
	var seg *segment
	if cfg.DataDir != "" {
		seg, n.store, n.persist, err = openPersistent(&n.cfg, words, log.With("component", "persist"))
		if err != nil {
			return nil, errors.Join(err, n.Close())
		}
		r := n.persist.started
		n.log.Info("arena opened", "data_dir", cfg.DataDir, "segment", cfg.SegmentPath, "fresh", r.Fresh, "adopted_blocks", r.Adopted,
			"adopted_bytes", r.AdoptedBytes, "dropped_bad_checksum", r.Dropped, "expired", r.Expired, "overlapped", r.Overlapped,
			"torn_journal_bytes", r.TornJournalBytes, "took", r.Took)
	} else {
		if seg, err = openSegment("kvpool-"+cfg.NodeID, cfg.SegmentPath, cfg.CapacityBytes, cfg.LockMemory, cfg.Prefault, cfg.HugePages); err != nil {
			return nil, errors.Join(err, n.Close())
		}
		n.store = store.New(n.cfg.StoreConfig, cfg.Now, seg.mem, words)
	}
	n.seg = seg
	n.blocks = n.store
	if cfg.DiskDir != "" {
		if err := n.openDisk(log.With("component", "disk")); err != nil {
			return nil, errors.Join(err, n.Close())
		}
	}
	if n.gate, err = newGatekeeper(&cfg.SecurityConfig, cfg.Now, n.log); err != nil {
		return nil, errors.Join(err, n.Close())
	}
	n.doors.tls = n.gate.tls
	n.doors.handshakeTimeout, n.doors.log = cfg.HandshakeTimeout, n.log
	n.doors.acceptFailed = func(door string) { n.metrics.acceptErrors.WithLabelValues(door).Inc() }
	n.doors.sorted = func(protocol string, tls bool) {
		security := "plaintext"
		if tls {
			security = "tls"
		}
		n.metrics.accepted.WithLabelValues(protocol, security).Inc()
	}
	n.doors.limits = connLimits{perDoor: cfg.MaxConnsPerDoor, perRemote: cfg.MaxConnsPerRemote,
		refused: func(door, reason string) { n.metrics.refusedConns.WithLabelValues(door, reason).Inc() }}
	n.doors.transferSendBuffer = cfg.ServeSendBufferBytes
	if err := n.doors.listen(&n.cfg.ServerConfig); err != nil {
		return nil, errors.Join(err, n.Close())
	}
	if !n.gate.open && !cfg.DisableShm {
		// Only the node's own user may connect to its sockets, unless
		// other users are allowed; each session then checks the peer's
		// uid (localCaller). The shm transport's socket is for peers, the
		// node's own user's.
		mode := os.FileMode(0o600)
		if len(cfg.ShmAllow) > 0 {
			mode = 0o666
		}
		for p, m := range map[string]os.FileMode{cfg.ShmSocket: mode, cfg.transferSocket(): 0o600} {
			if err := os.Chmod(p, m); err != nil {
				return nil, errors.Join(fmt.Errorf("pool: restrict %s: %w", p, err), n.Close())
			}
		}
	}
	if n.metrics, err = newMetrics(cfg.Registerer, n.store, &n.doors.limits); err != nil {
		return nil, errors.Join(err, n.Close())
	}
	if n.disk != nil {
		if err := cfg.Registerer.Register(diskCollector{n.disk, n.blocks.(*tiers)}); err != nil {
			return nil, errors.Join(err, n.Close())
		}
	}
	if n.persist != nil {
		if err := cfg.Registerer.Register(persistCollector{n.persist}); err != nil {
			return nil, errors.Join(err, n.Close())
		}
	}
	n.engine = &engineLoad{profiles: cfg.Profiles, now: cfg.Now, store: n.store}

	// Transfers.
	n.links = transfer.NewLinks(cfg.Links)
	peerTLS := n.peerTLSFor(n.gate.peerTLS())
	n.tcpT = transfer.NewTCP(transfer.TCPConfig{ConnsPerPeer: cfg.TransferConns, IdleTimeout: cfg.IdleTimeout, IOTimeout: cfg.IOTimeout, Logger: log,
		TLSFor: peerTLS, Token: n.gate.peerToken, Congestion: cfg.TCPCongestion})
	var grpcAccess transfer.Access
	if !n.gate.open {
		n.grants = &grants{open: n.store.ReservationOpen}
		grpcAccess = func(ctx context.Context, kind transfer.Kind, region transfer.RegionID, offset, length uint64) error {
			return n.grants.access(callerOf(ctx).Name)(ctx, kind, region, offset, length)
		}
	}
	n.grpcT = transfer.NewGRPC(transfer.GRPCConfig{TLSFor: peerTLS, Token: n.gate.peerToken, Access: grpcAccess})
	n.tcpT.Register(arenaRegion, seg.mem)
	n.grpcT.Register(arenaRegion, seg.mem)
	var pull, shmPull transfer.Transport = n.tcpT, nil
	if cfg.Transport == transfer.ProtocolGRPC {
		pull = n.grpcT
	}
	if !cfg.DisableShm {
		n.shmT = transfer.NewSHM(transfer.SHMConfig{DialTimeout: cfg.HandshakeTimeout, IOTimeout: cfg.IOTimeout})
		if err := n.shmT.RegisterFile(arenaRegion, seg.file, 0, uint64(len(seg.mem))); err != nil {
			return nil, errors.Join(err, n.Close())
		}
		if cfg.Transport == transfer.ProtocolSHM {
			shmPull = n.shmT
		}
	}
	if cfg.WrapTransport != nil {
		pull = cfg.WrapTransport(pull)
		if shmPull != nil {
			shmPull = cfg.WrapTransport(shmPull)
		}
	}
	if err := cfg.Registerer.Register(&linkCollector{links: n.links, now: cfg.Now}); err != nil {
		return nil, errors.Join(err, n.Close())
	}

	// Membership.
	if cfg.Etcd != nil {
		if n.cluster, err = newCluster(n, log); err != nil {
			return nil, errors.Join(err, n.Close())
		}
		if n.disk != nil {
			sink := tieredSink{next: n.cluster.member, memory: n.store, disk: n.disk}
			n.store.SetSink(sink)
			n.disk.SetSink(sink)
		} else {
			n.store.SetSink(n.cluster.member)
		}
		n.engine.refresh = n.cluster.gossip.Refresh
		if err := cfg.Registerer.Register(&clusterCollector{n.cluster}); err != nil {
			return nil, errors.Join(err, n.Close())
		}
	}
	var view clusterView // nil interface when standalone
	if n.cluster != nil {
		view = n.cluster
	}

	n.fetcher = &fetcher{
		self: cfg.NodeID, zone: cfg.Zone, hostID: n.hostID, advertise: n.advertised(), timeout: cfg.FetchTimeout,
		store: n.blocks, cluster: view, links: n.links, pull: pull, shmPull: shmPull,
		peers: newPeerPool(peerTLS, n.gate.peerToken, cfg.TCPCongestion), fetched: n.metrics.fetched, fetchedBlocks: n.metrics.fetchedBlocks, fetchFailures: n.metrics.fetchFailures, callOverhead: n.metrics.callOverhead, now: cfg.Now, log: log.With("component", "fetch"),
	}
	n.planner = &planner{cfg: &n.cfg.PlanConfig, self: cfg.NodeID, store: n.blocks, cluster: view, links: n.links,
		load: n.engine.load, now: cfg.Now, placed: newPlacements(cfg.PlacementTTL), decisions: n.metrics.planDecisions}
	if t, ok := n.blocks.(*tiers); ok {
		n.planner.disk = t
	}
	if len(cfg.EngineEvents) > 0 {
		t, err := engines.New(engines.Config{Engines: cfg.EngineEvents, Logger: log.With("component", "engine-events"), Now: cfg.Now})
		if err != nil {
			return nil, errors.Join(err, n.Close())
		}
		n.engines, n.planner.gpu = t, t
	}
	if n.cluster != nil {
		n.peerCaches = &peerCaches{
			self: cfg.NodeID, nodes: n.cluster.Nodes, dead: n.cluster.Dead, dial: peerDialer(peerTLS, n.gate.peerToken),
			log: log.With("component", "engine-caches"), now: cfg.Now, retry: 250 * time.Millisecond, reconcile: 250 * time.Millisecond,
			updated: n.metrics.peerCacheUpdates.Inc, peers: map[string]*peerCache{},
		}
		n.planner.peerGPU = n.peerCaches
	}
	ec := &engineCollector{}
	if n.engines != nil {
		ec.engines = n.engines.Stats
	}
	if n.peerCaches != nil {
		ec.peers = n.peerCaches.Status
	}
	if err := cfg.Registerer.Register(ec); err != nil {
		return nil, errors.Join(err, n.Close())
	}
	leases := leaseLimits{def: cfg.LeaseDefault, max: cfg.LeaseMax}
	n.data = &dataServer{
		store: n.blocks, replicas: n.fetcher, fetch: n.fetcher, leases: leases, metrics: n.metrics, log: n.log,
		ioTimeout: cfg.IOTimeout, idleTimeout: cfg.IdleTimeout, spinWait: cfg.SpinWait, noBench: cfg.NoBenchFrames, spinners: wire.NewSpinners(), hello: n.hello,
		gate: n.gate, grants: n.grants,
	}
	if cfg.SpinWait > 0 {
		n.data.sweeper = newMailboxSweeper(max(cfg.SpinWait, reservationSpin))
	}

	// The gRPC server: the services, each mapping its errors to codes
	// once, in the interceptors (metrics.go).
	n.grpcSrv = grpc.NewServer(append(transfer.ServerOptions(),
		// TLS, when configured, is terminated by the door loop (sniff);
		// preTLS hands its state to the gatekeeper's interceptors.
		grpc.Creds(preTLS{}),
		grpc.MaxRecvMsgSize(MaxBatchBytes+1<<20),
		grpc.MaxSendMsgSize(MaxBatchBytes+1<<20),
		// The HTTP/2 handshake has the handshake timeout; a connection
		// with no call open is closed after the idle timeout, and one that
		// goes quiet is pinged after the io timeout and closed when it does
		// not answer within another (a half-sent frame never completes).
		grpc.ConnectionTimeout(cfg.HandshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: cfg.IdleTimeout, Time: cfg.IOTimeout, Timeout: cfg.IOTimeout}),
		// Metrics first, so refused calls are counted with their code;
		// then the gatekeeper, before any handler runs.
		grpc.ChainUnaryInterceptor(n.metrics.unaryInterceptor, n.gate.unaryInterceptor),
		grpc.ChainStreamInterceptor(n.metrics.streamInterceptor, n.gate.streamInterceptor),
	)...)
	n.grpcT.RegisterServer(n.grpcSrv)
	kv := &kvService{
		info: n.info(), store: n.blocks, leases: leases, fetch: n.fetcher, replicas: n.fetcher, plan: n.planner,
		engine: n.engine, stopping: n.stopping, tasks: &n.doors.tasks, reservationTimeout: cfg.ReservationTimeout, getChunkBytes: cfg.GetChunkBytes,
		memoryLocked: seg.locked, now: cfg.Now,
	}
	if n.engines != nil {
		kv.caches, kv.gpu = n.engines, n.engines
	}
	kvpoolv1.RegisterKVPoolServiceServer(n.grpcSrv, kv)
	admin := &adminService{self: cfg.NodeID, transport: cfg.Transport.String(), links: n.links, tenants: n.store,
		policies: newPolicies(cfg.Etcd, cfg.MetadataPrefix, n.blocks), drainer: n, now: cfg.Now}
	if n.cluster != nil {
		admin.cluster = n.cluster
		admin.gpu = n.gpuPrefix
	}
	kvpoolv1.RegisterAdminServiceServer(n.grpcSrv, admin)
	n.health = health.NewServer()
	healthpb.RegisterHealthServer(n.grpcSrv, n.health)
	reflection.Register(n.grpcSrv)
	return n, nil
}

// info is what Info reports.
func (n *Node) info() *kvpoolv1.InfoResponse {
	return &kvpoolv1.InfoResponse{
		NodeId:        n.cfg.NodeID,
		Version:       n.cfg.Version,
		HostId:        n.hostID,
		ShmSocket:     n.ShmSocket(),
		DataChannel:   true,
		MaxBlockBytes: uint64(n.cfg.MaxBlockBytes),
		MaxKeyBytes:   api.MaxKeyBytes,
		PageBytes:     uint64(n.cfg.PageBytes),
		CapacityBytes: uint64(n.cfg.CapacityBytes),
		ReserveAhead:  true,
		SessionSpares: maxSessionSpares,
		FetchFrames:   true,
		ShmMailbox:    true,
		ExistsFrames:  true,
	}
}

// hello is what a same-host client receives on the shm socket: the Hello,
// and the descriptors of the segment and of the version words.
func (n *Node) hello() (*wire.Hello, []int) {
	return &wire.Hello{SegmentBytes: uint64(len(n.seg.mem)), PageBytes: uint32(n.cfg.PageBytes),
		VersionWords: uint64(n.store.VersionWords()), NodeID: n.cfg.NodeID}, []int{int(n.seg.file.Fd()), int(n.versions.file.Fd())}
}

// advertised is the address others reach this node's gRPC service and
// data channel at.
func (n *Node) advertised() string {
	if n.cfg.AdvertiseAddr != "" {
		return n.cfg.AdvertiseAddr
	}
	return n.doors.tcp.Addr().String()
}

// Addr is the address serving gRPC and the data channel.
func (n *Node) Addr() net.Addr { return n.doors.tcp.Addr() }

// gpuPrefix is how many leading keys of chain one of node's engines holds
// in GPU memory, as this daemon knows it, and whether it knows.
func (n *Node) gpuPrefix(node, tenant, namespace string, chain [][]byte) (int, bool) {
	if node == n.cfg.NodeID {
		if n.engines == nil {
			return 0, false
		}
		return n.engines.Prefix(tenant, namespace, chain), true
	}
	if n.peerCaches == nil {
		return 0, false
	}
	return n.peerCaches.Prefix(node, tenant, namespace, chain)
}

// PeerCaches reports the peers whose engines' GPU caches this node
// follows.
func (n *Node) PeerCaches() []PeerCacheStatus {
	if n.peerCaches == nil {
		return nil
	}
	return n.peerCaches.Status()
}

// EngineStats reports the engines' event streams this node follows (none
// without PlanConfig.EngineEvents).
func (n *Node) EngineStats() []engines.Stats {
	if n.engines == nil {
		return nil
	}
	return n.engines.Stats()
}

// MetricsAddr is the address serving /metrics, or nil.
func (n *Node) MetricsAddr() net.Addr {
	if n.doors.http == nil {
		return nil
	}
	return n.doors.http.Addr()
}

// ShmSocket is the path of the shared-memory socket, or "".
func (n *Node) ShmSocket() string {
	if n.doors.shm == nil {
		return ""
	}
	return n.cfg.ShmSocket
}

// Store returns the node's block store.
func (n *Node) Store() *store.Store { return n.store }

// Links returns the node's per-link estimates.
func (n *Node) Links() *transfer.Links { return n.links }

// ID returns the node id.
func (n *Node) ID() string { return n.cfg.NodeID }

// Plan answers a fetch-or-recompute query as the Plan RPC does, without
// the RPC (benchmarks and tools in this module).
func (n *Node) Plan(q PlanQuery) (PlanAnswer, error) { return n.planner.Plan(q) }

// Ready is closed once Run is serving.
func (n *Node) Ready() <-chan struct{} { return n.ready }

// Run serves until ctx is done or a drain has ended, then shuts down
// gracefully; with DrainOnStop, the end of ctx drains the node first
// (the services keep running meanwhile). It returns nil after a clean
// shutdown, else every service's error.
func (n *Node) Run(stop context.Context) error {
	// The services' context outlives stop when the node drains on stop.
	ctx, cancel := context.WithCancel(context.WithoutCancel(stop))
	defer cancel()
	n.serving = ctx
	g := services{cancel: cancel}
	var httpSrv *http.Server
	if n.doors.http != nil {
		httpSrv = &http.Server{Handler: n.httpHandler(), ReadHeaderTimeout: n.cfg.HandshakeTimeout,
			WriteTimeout: n.cfg.IOTimeout, IdleTimeout: n.cfg.IdleTimeout}
		g.Go("metrics server", func() error {
			ln := limitedListener{Listener: n.doors.http, door: doorMetrics, limits: &n.doors.limits}
			if err := httpSrv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	if n.engines != nil {
		g.Go("engine events", func() error { return n.engines.Run(ctx) })
	}
	if n.cfg.Prefault || n.cfg.LockMemory {
		n.metrics.arenaPopulated.Set(float64(n.cfg.CapacityBytes))
	}
	if n.persist != nil {
		g.Go("journal", func() error { return n.persist.run(ctx) })
	}
	if n.disk != nil {
		g.Go("disk writers", func() error { return n.disk.Run(ctx) })
	}
	g.Go("grpc server", func() error {
		if err := n.grpcSrv.Serve(n.doors.grpc); !errors.Is(err, grpc.ErrServerStopped) {
			return err
		}
		return nil
	})
	g.Go("accept loop", func() error {
		return n.doors.acceptTCP(ctx, func(c net.Conn, token string) {
			id, err := n.gate.identify(tlsStateOf(c), token)
			n.data.serve(ctx, c, newCallerSession(id, err))
		}, func(ctx context.Context, c net.Conn, token string) error {
			// Only nodes may pass, and before any byte of the arena moves.
			id, err := n.gate.identify(tlsStateOf(c), token)
			if err == nil {
				err = n.gate.check(id, auth.OpTransfer, "")
			}
			if err != nil {
				n.log.Warn("transfer connection refused", "remote", remote(c), "err", err)
				return err
			}
			serving := transfer.Serving{Blocks: &namedBlocks{store: n.blocks, gate: n.gate, caller: id}}
			if n.grants != nil {
				serving.Access = n.grants.access(id.Name)
			}
			err = n.tcpT.ServeConnWith(ctx, c, serving)
			if err != nil {
				n.log.Debug("transfer connection ended", "remote", remote(c), "err", err)
			}
			return err
		})
	})
	if n.doors.shm != nil {
		g.Go("shm accept loop", func() error { return n.doors.acceptShm(ctx, n.data.serveShm) })
		if n.data.sweeper != nil {
			g.Go("shm mailbox sweeper", func() error { n.data.sweeper.run(ctx); return nil })
		}
		g.Go("shm transfer accept loop", func() error {
			return n.doors.acceptShmTransfer(ctx, func(ctx context.Context, c *net.UnixConn) {
				// Same-host peers are of the node's own user (the socket
				// is 0600 on a secured node; the uid is checked too).
				if !n.gate.open {
					if _, err := localCaller(c, nil); err != nil {
						n.log.Warn("shm transfer connection refused", "err", err)
						return
					}
				}
				n.shmT.ServeAccepted(ctx, c)
			})
		})
	}
	g.Go("reservation sweeper", func() error { n.sweep(ctx); return nil })
	g.Go("token reloader", func() error { n.gate.watchTokens(ctx); return nil })
	if n.cluster != nil {
		n.cluster.run(ctx, &g)
		g.Go("peer engine caches", func() error { n.peerCaches.Run(ctx); return nil })
	}
	n.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	n.health.SetServingStatus(kvpoolv1.KVPoolService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	close(n.ready)
	if !n.cfg.Prefault && !n.cfg.LockMemory && n.cfg.PopulateBytesPerSecond > 0 {
		// Once it serves: the population never delays readiness.
		g.Go("arena population", func() error { n.populateArena(ctx); return nil })
	}
	switch {
	case n.gate.open && n.cfg.Insecure && !isLoopback(n.cfg.ListenAddr):
		n.log.Warn("running open to the network (--insecure): no client CA or token file, so every caller may do everything", "listen", n.cfg.ListenAddr)
	case n.gate.open:
		n.log.Info("running open on loopback: no client CA or token file, so every local caller may do everything")
	}
	n.log.Info("serving", "addr", n.Addr().String(), "shm_socket", n.ShmSocket(), "capacity_bytes", n.cfg.CapacityBytes,
		"page_bytes", n.cfg.PageBytes, "memory_locked", n.seg.locked)

	select {
	case <-stop.Done():
		if n.cfg.DrainOnStop {
			if _, err := n.Drain(ctx, 0); err != nil {
				n.log.Warn("drain on stop", "err", err)
			}
		}
	case <-n.drain.done:
	case <-ctx.Done(): // a service failed
	}
	cancel()
	close(n.stopping)
	n.health.Shutdown()
	// Stop accepting: closing the listeners ends the accept loops.
	n.doors.stopAccepting()
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
	n.doors.closeConns()
	err := g.Wait()
	n.log.Info("stopped")
	return err
}

// services runs a node's long-lived goroutines: the first to fail cancels
// the others, and Wait returns every failure, however many there are.
type services struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	errs   []error
}

// Go runs f; an error from it is recorded as name's and stops the node.
func (s *services) Go(name string, f func() error) {
	s.wg.Go(func() {
		if err := f(); err != nil {
			s.mu.Lock()
			s.errs = append(s.errs, fmt.Errorf("pool: %s: %w", name, err))
			s.mu.Unlock()
			s.cancel()
		}
	})
}

// Wait waits for every goroutine and joins their errors.
func (s *services) Wait() error {
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return errors.Join(s.errs...)
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
			if n.disk != nil {
				n.disk.Sweep(now)
			}
		}
	}
}

// Close releases the listeners and the segment. It is idempotent. Call it
// after Run has returned.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		n.doors.close() // may already be closed by Run; that error is moot
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
		if n.fetcher != nil {
			n.fetcher.peers.Close()
		}
		if n.disk != nil {
			n.closeErr = errors.Join(n.closeErr, n.disk.Close())
		}
		if n.persist != nil {
			// Every server has stopped committing: the journal holds
			// every committed block once this returns.
			n.closeErr = errors.Join(n.closeErr, n.persist.close())
		}
		if n.seg != nil {
			n.segMu.Lock()
			n.segClosed = true
			n.segMu.Unlock()
			n.closeErr = errors.Join(n.closeErr, n.seg.close())
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
			if n.store.Draining() {
				http.Error(w, "draining", http.StatusServiceUnavailable)
				return
			}
			io.WriteString(w, "ready\n")
		default:
			http.Error(w, "starting", http.StatusServiceUnavailable)
		}
	})
	return mux
}

// Disk returns the node's disk tier; nil without one.
func (n *Node) Disk() *disk.Tier { return n.disk }

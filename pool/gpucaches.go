package pool

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvpool/kvpool/api"
	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
	"github.com/kvpool/kvpool/metadata"
	"github.com/kvpool/kvpool/metadata/engines"
)

// GPU tiers across the cluster. Each daemon follows its own engines' KV
// events (metadata/engines) and serves what they hold to its peers over a
// WatchEngineCaches stream; every daemon keeps a copy of every peer's, so
// any daemon plans with every node's GPU tier. A direct stream, rather
// than etcd or gossip: engines change their caches hundreds to thousands
// of times a second per node (docs/routing.md), too often for etcd's
// writes and too much for gossip's packets, and a stream delivers each
// change in milliseconds.

// engineCaches is what WatchEngineCaches serves. *engines.Tracker
// implements it.
type engineCaches interface {
	Watch(ctx context.Context, fn func(engines.Update) error) error
}

// maxKeysPerUpdate bounds one WatchEngineCaches message (a snapshot is
// split): 16,384 keys of at most 128 bytes stay under gRPC's 4 MiB.
const maxKeysPerUpdate = 16384

// watchEngineCaches streams caches' updates to one peer until the peer
// goes, the node stops (stopping) or the peer falls behind (it then
// watches again and gets a fresh snapshot).
func watchEngineCaches(caches engineCaches, self string, stopping <-chan struct{}, stream kvpoolv1.KVPoolService_WatchEngineCachesServer) error {
	if caches == nil {
		return api.Errorf(api.ErrFailedPrecondition, "pool: node %s follows no engines' KV events", self)
	}
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	go func() {
		select {
		case <-stopping:
			cancel()
		case <-ctx.Done():
		}
	}()
	err := caches.Watch(ctx, func(u engines.Update) error {
		// Within one update a key may change more than once: its last
		// change is its state, so added and removed come out disjoint.
		last := make(map[string]bool, len(u.Keys))
		for _, k := range u.Keys {
			last[k.Key] = k.Held
		}
		msg := &kvpoolv1.WatchEngineCachesResponse{NodeId: self, Engine: u.Engine, Tenant: u.Tenant, Namespace: u.Namespace, Reset_: u.Reset}
		flush := func() error {
			err := stream.Send(msg)
			msg = &kvpoolv1.WatchEngineCachesResponse{NodeId: self, Engine: u.Engine, Tenant: u.Tenant, Namespace: u.Namespace}
			return err
		}
		n := 0
		for k, held := range last {
			if held {
				msg.Added = append(msg.Added, []byte(k))
			} else {
				msg.Removed = append(msg.Removed, []byte(k))
			}
			if n++; n%maxKeysPerUpdate == 0 {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		if n%maxKeysPerUpdate != 0 || n == 0 {
			return flush()
		}
		return nil
	})
	select {
	case <-stopping:
		return nil // shutting down: the peer reconnects elsewhere or later
	default:
	}
	if errors.Is(err, engines.ErrWatcherBehind) {
		return api.Errorf(api.ErrUnavailable, "pool: %v; watch again", err)
	}
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// peerCaches keeps a copy of every live peer's engines' GPU caches, one
// WatchEngineCaches stream per peer that follows engines (its record's
// EngineCaches). A peer whose stream is down counts as holding nothing in
// GPU until a new stream's snapshot arrives: the copy may know less than
// the peer's engines hold, never more. Run owns the streams; Prefix and
// Status are safe concurrently with it.
type peerCaches struct {
	self  string
	nodes func() []metadata.NodeInfo
	dead  func(id string) bool
	dial  func(addr string) (*grpc.ClientConn, error)
	log   *slog.Logger
	now   func() time.Time
	// retry is how long a broken stream waits before it reconnects, and
	// reconcile how often the peer set is compared with the live nodes.
	retry, reconcile time.Duration
	// updated, when set, counts each update applied.
	updated func()

	mu    sync.Mutex
	peers map[string]*peerCache
}

// peerCache is one peer's engines, as its stream told them.
type peerCache struct {
	epoch     int64
	addr      string
	stop      context.CancelFunc
	done      chan struct{}
	connected bool
	engines   map[string]*engineCopy
	updates   int64
	last      time.Time
}

// engineCopy is one engine's GPU-resident keys.
type engineCopy struct {
	tenant, namespace string
	keys              map[string]struct{}
}

// Prefix is the longest run of leading keys of chain that one engine of
// node, serving tenant and namespace, holds in GPU memory; followed is
// whether node's engines are followed at all (with a stream up).
func (pc *peerCaches) Prefix(node, tenant, namespace string, chain [][]byte) (blocks int, followed bool) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	p := pc.peers[node]
	if p == nil || !p.connected {
		return 0, false
	}
	for _, e := range p.engines {
		if (e.tenant != "" && e.tenant != tenant) || (e.namespace != "" && e.namespace != namespace) {
			continue
		}
		n := 0
		for n < len(chain) {
			if _, ok := e.keys[string(chain[n])]; !ok {
				break
			}
			n++
		}
		blocks = max(blocks, n)
	}
	return blocks, true
}

// PeerCacheStatus is what a daemon knows of one peer's engines.
type PeerCacheStatus struct {
	Node      string
	Connected bool
	Engines   int
	Keys      int
	Updates   int64
	// LastUpdate is when the stream last delivered; zero before.
	LastUpdate time.Time
}

// Status reports every followed peer, by node id.
func (pc *peerCaches) Status() []PeerCacheStatus {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	out := make([]PeerCacheStatus, 0, len(pc.peers))
	for id, p := range pc.peers {
		s := PeerCacheStatus{Node: id, Connected: p.connected, Engines: len(p.engines), Updates: p.updates, LastUpdate: p.last}
		for _, e := range p.engines {
			s.Keys += len(e.keys)
		}
		out = append(out, s)
	}
	return out
}

// Run follows the live peers that follow engines until ctx ends.
func (pc *peerCaches) Run(ctx context.Context) {
	t := time.NewTicker(pc.reconcile)
	defer t.Stop()
	for {
		pc.reconcilePeers(ctx)
		select {
		case <-ctx.Done():
			pc.mu.Lock()
			peers := pc.peers
			pc.peers = map[string]*peerCache{}
			pc.mu.Unlock()
			for _, p := range peers {
				p.stop()
				<-p.done
			}
			return
		case <-t.C:
		}
	}
}

// reconcilePeers starts a stream to each live peer that follows engines
// and is not followed yet (or moved: a new epoch or address), and stops
// the streams of peers that are gone.
func (pc *peerCaches) reconcilePeers(ctx context.Context) {
	want := map[string]metadata.NodeRecord{}
	for _, ni := range pc.nodes() {
		r := ni.Record
		if r.ID == pc.self || r.EngineCaches == 0 || r.Addrs[addrGRPC] == "" || pc.dead(r.ID) {
			continue
		}
		want[r.ID] = r
	}
	var stopped []*peerCache
	pc.mu.Lock()
	for id, p := range pc.peers {
		if r, ok := want[id]; !ok || r.Epoch != p.epoch || r.Addrs[addrGRPC] != p.addr {
			delete(pc.peers, id)
			stopped = append(stopped, p)
		}
	}
	for id, r := range want {
		if _, ok := pc.peers[id]; ok {
			continue
		}
		sctx, stop := context.WithCancel(ctx)
		p := &peerCache{epoch: r.Epoch, addr: r.Addrs[addrGRPC], stop: stop, done: make(chan struct{}), engines: map[string]*engineCopy{}}
		pc.peers[id] = p
		go func() {
			defer close(p.done)
			pc.follow(sctx, id, p)
		}()
	}
	pc.mu.Unlock()
	for _, p := range stopped {
		p.stop()
		<-p.done
	}
}

// follow keeps one peer's stream up until ctx ends.
func (pc *peerCaches) follow(ctx context.Context, id string, p *peerCache) {
	conn, err := pc.dial(p.addr)
	if err != nil {
		pc.log.Warn("engine caches: cannot dial peer", "peer", id, "addr", p.addr, "err", err)
		return // the next reconcile after the record changes tries again
	}
	defer conn.Close()
	client := kvpoolv1.NewKVPoolServiceClient(conn)
	for ctx.Err() == nil {
		err := pc.stream(ctx, client, id, p)
		pc.mu.Lock()
		p.connected = false
		clear(p.engines)
		pc.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		pc.log.Debug("engine caches: peer stream ended; reconnecting", "peer", id, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(pc.retry):
		}
	}
}

func (pc *peerCaches) stream(ctx context.Context, client kvpoolv1.KVPoolServiceClient, id string, p *peerCache) error {
	s, err := client.WatchEngineCaches(ctx, &kvpoolv1.WatchEngineCachesRequest{})
	if err != nil {
		return err
	}
	for {
		u, err := s.Recv()
		if err != nil {
			return err
		}
		if u.GetNodeId() != id {
			return api.Errorf(api.ErrFailedPrecondition, "pool: engine caches of %s answered by node %q", id, u.GetNodeId())
		}
		pc.mu.Lock()
		e := p.engines[u.GetEngine()]
		if e == nil || u.GetReset_() {
			e = &engineCopy{keys: map[string]struct{}{}}
			p.engines[u.GetEngine()] = e
		}
		e.tenant, e.namespace = u.GetTenant(), u.GetNamespace()
		for _, k := range u.GetAdded() {
			e.keys[string(k)] = struct{}{}
		}
		for _, k := range u.GetRemoved() {
			delete(e.keys, string(k))
		}
		p.connected = true
		p.updates++
		p.last = pc.now()
		pc.mu.Unlock()
		if pc.updated != nil {
			pc.updated()
		}
	}
}

// engineCollector exports the engines' event streams and the peers'
// copies at scrape time.
type engineCollector struct {
	engines func() []engines.Stats
	peers   func() []PeerCacheStatus
}

var (
	engineLabels      = []string{"engine"}
	descEngineMsgs    = prometheus.NewDesc("kvpool_engine_events_messages_total", "KV event messages received from an engine (batches, with replayed ones), malformed ones included.", engineLabels, nil)
	descEngineEvents  = prometheus.NewDesc("kvpool_engine_events_applied_total", "KV events (BlockStored, BlockRemoved, AllBlocksCleared) applied to an engine's index.", engineLabels, nil)
	descEngineBad     = prometheus.NewDesc("kvpool_engine_events_malformed_total", "KV event messages that did not decode and were skipped.", engineLabels, nil)
	descEngineGaps    = prometheus.NewDesc("kvpool_engine_events_gaps_total", "Sequence gaps seen in an engine's stream.", engineLabels, nil)
	descEngineLost    = prometheus.NewDesc("kvpool_engine_events_lost_total", "Gaps the engine's replay could not fill: the index forgot what it knew and rebuilds from new events.", engineLabels, nil)
	descEngineRestart = prometheus.NewDesc("kvpool_engine_events_restarts_total", "Engine restarts seen (its sequence began again at 0).", engineLabels, nil)
	descEngineReplays = prometheus.NewDesc("kvpool_engine_events_replays_total", "Replay requests made to an engine's replay socket.", engineLabels, nil)
	descEngineLag     = prometheus.NewDesc("kvpool_engine_events_lag_seconds", "How far the last applied batch was behind the engine's clock when it was applied.", engineLabels, nil)
	descEngineBlocks  = prometheus.NewDesc("kvpool_engine_gpu_blocks", "kvpool keys an engine holds in GPU memory, by its events.", engineLabels, nil)
	descEngineUp      = prometheus.NewDesc("kvpool_engine_events_connected", "1 while the engine's event stream is subscribed.", engineLabels, nil)
	descPeerKeys      = prometheus.NewDesc("kvpool_engine_caches_peer_blocks", "kvpool keys a peer's engines hold in GPU memory, in this daemon's copy.", []string{"peer"}, nil)
	descPeerUp        = prometheus.NewDesc("kvpool_engine_caches_peer_connected", "1 while this daemon follows the peer's engines' caches.", []string{"peer"}, nil)
)

func (ec *engineCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descEngineMsgs, descEngineEvents, descEngineBad, descEngineGaps, descEngineLost, descEngineRestart,
		descEngineReplays, descEngineLag, descEngineBlocks, descEngineUp, descPeerKeys, descPeerUp} {
		ch <- d
	}
}

func (ec *engineCollector) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v int64, label string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), label)
	}
	gauge := func(d *prometheus.Desc, v float64, label string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, label)
	}
	up := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	if ec.engines != nil {
		for _, s := range ec.engines() {
			counter(descEngineMsgs, s.Messages+s.Malformed, s.Name)
			counter(descEngineEvents, s.Events, s.Name)
			counter(descEngineBad, s.Malformed, s.Name)
			counter(descEngineGaps, s.Gaps, s.Name)
			counter(descEngineLost, s.Lost, s.Name)
			counter(descEngineRestart, s.Restarts, s.Name)
			counter(descEngineReplays, s.Replays, s.Name)
			gauge(descEngineLag, s.LagSeconds, s.Name)
			gauge(descEngineBlocks, float64(s.Held), s.Name)
			gauge(descEngineUp, up(s.Connected), s.Name)
		}
	}
	if ec.peers != nil {
		for _, p := range ec.peers() {
			gauge(descPeerKeys, float64(p.Keys), p.Node)
			gauge(descPeerUp, up(p.Connected), p.Node)
		}
	}
}

// peerDialer opens gRPC connections to peers, with the node's peer TLS
// and token.
func peerDialer(tlsFor func(addr string) *tls.Config, token string) func(addr string) (*grpc.ClientConn, error) {
	return func(addr string) (*grpc.ClientConn, error) {
		creds := insecure.NewCredentials()
		if tlsFor != nil {
			if c := tlsFor(addr); c != nil {
				creds = credentials.NewTLS(c)
			}
		}
		opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
		if token != "" {
			opts = append(opts, grpc.WithPerRPCCredentials(api.BearerToken(token)))
		}
		return grpc.NewClient(addr, opts...)
	}
}

package pool

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/wire"
	"github.com/kvpool/kvpool/metadata/engines"
	"github.com/kvpool/kvpool/pool/store"
	"github.com/kvpool/kvpool/transfer"
	"github.com/kvpool/kvpool/transfer/cost"
)

// Config configures a node: one embedded Config per component, plus what
// the whole node shares. New copies it, fills defaults for zero fields and
// reports every problem at once.
type Config struct {
	// NodeID names the node in the cluster: [A-Za-z0-9._-]{1,64}. Required.
	NodeID string

	StoreConfig
	ServerConfig
	SecurityConfig
	ClusterConfig
	TransferConfig
	PlanConfig
	PersistConfig
	DiskConfig
	DrainConfig

	// Version is reported by Info. Default "dev".
	Version string
	// Logger receives the node's logs; the node scopes it with its id and
	// each component's name. Default: discard.
	Logger *slog.Logger
	// Registerer receives the node's metrics. Default: a private registry
	// (served on MetricsAddr).
	Registerer prometheus.Registerer
	// Gatherer serves /metrics; it must see what Registerer registers.
	// Default: the private registry, or prometheus.DefaultGatherer when
	// Registerer is prometheus.DefaultRegisterer.
	Gatherer prometheus.Gatherer
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// ServerConfig configures the node's doors: the TCP port shared by gRPC,
// the data channel and the tcp transport, the unix socket of same-host
// clients, and the metrics listener.
type ServerConfig struct {
	// ListenAddr is the TCP address that serves gRPC, the framed data
	// channel and the tcp transport (told apart by their first bytes).
	// Default "127.0.0.1:7070"; port 0 picks a free port, see Node.Addr.
	ListenAddr string
	// MetricsAddr serves Prometheus /metrics, /healthz and /readyz over
	// HTTP. Empty disables it.
	MetricsAddr string
	// ShmSocket is the unix socket that hands same-host clients the
	// segment. Default $TMPDIR/kvpool-<NodeID>.sock; see DisableShm.
	ShmSocket string
	// DisableShm turns the same-host shared-memory path off.
	DisableShm bool
	// NoBenchFrames refuses the data channel's source and sink frames, the
	// link baselines `kvpool node bench --server` measures against. Each
	// asks for at most the max block size either way.
	NoBenchFrames bool
	// IOTimeout bounds how long the data channel waits for the rest of a
	// frame once it has started, and for a write to drain. Default 30 s.
	IOTimeout time.Duration
	// IdleTimeout closes data-channel connections that send nothing for
	// this long, and gRPC connections with no call open. Default 10 min.
	IdleTimeout time.Duration
	// HandshakeTimeout is how long a new connection on any door may take
	// to send its first bytes (the data channel's or the transport's
	// preamble, gRPC's HTTP/2 preface, a metrics request's header) before
	// it is closed: a connection that says nothing is only a descriptor
	// held. Default 2 s.
	HandshakeTimeout time.Duration
	// MaxConnsPerDoor caps the open connections on each door (the TCP
	// port, the shm socket, the shm transport's socket, the metrics
	// listener); one more is closed as soon as it is accepted and counted
	// in kvpool_pool_refused_connections_total. Default 16384; keep the
	// doors' sum under the process's file descriptor limit.
	MaxConnsPerDoor int
	// MaxConnsPerRemote caps the open connections from one remote IP
	// address, over the TCP port and the metrics listener together, so one
	// client cannot fill a door. Default 1024.
	MaxConnsPerRemote int
	// SpinWait is how long a data connection keeps polling its socket for
	// the next request before its goroutine sleeps. Waking a sleeping
	// thread costs tens of microseconds (more on a VM), a round trip's
	// worth: a client that sends its next request within this window gets
	// an answer without paying for it. The cost is at most this much CPU
	// per request, and a connection whose spins keep missing (its client
	// works longer than this between requests) backs off spinning. At
	// most half the node's processors spin at once. The node's own waits
	// for its peers (a Fetch's pins, the tcp transport) do not spin: with
	// two nodes on two cores that measured slower (1-block fetches 0.45 of
	// raw TCP without, 0.38 with). A positive SpinWait also runs the
	// node's mailbox sweeper (see mailboxSweeper), which watches the
	// mailboxes of same-host sessions from other processes while their
	// posts come close together. Default 100 µs; negative turns spinning
	// (and the sweeper) off.
	SpinWait time.Duration
	// GetChunkBytes is the default chunk size of gRPC Get streams. Default
	// 1 MiB.
	GetChunkBytes int
	// TCPCongestion is the TCP congestion control (Linux TCP_CONGESTION)
	// of the connections that carry blocks: the data channel's and the
	// tcp transport's, accepted or dialed. Default "cubic"
	// (wire.DefaultCongestion): BBR, many hosts' default, paces each
	// connection at its model of the path, and on fetches (bursts after
	// idle) that model can fall far below the link. Measured on
	// loopback: up to four of forty single-block fetches stalled 15-75 ms
	// under BBR, none under CUBIC, and fetch times scattered less
	// (docs/benchmarks-history.md). The node sets it on its listener and
	// dialers, before the handshake: a connection that starts under BBR
	// stays paced after it switches. "host" keeps the host's default. New
	// refuses an algorithm the kernel does not have or does not allow
	// this process, but where the default is not to be had it logs a
	// warning and keeps the host's.
	TCPCongestion string
}

// ClusterConfig configures the node's membership: its records in etcd,
// its mirror of everyone's, and gossip. Without Etcd the node runs
// standalone and the rest is unused.
type ClusterConfig struct {
	// Etcd, when set, makes the node a cluster member: it registers in
	// etcd on a lease, publishes where its blocks are, mirrors where
	// everyone's are, and gossips liveness and load. The caller owns the
	// client. nil runs a standalone node.
	Etcd *clientv3.Client
	// MetadataPrefix roots the cluster's etcd keys. Default "/kvpool/".
	MetadataPrefix string
	// LeaseTTL is the lease of the node's etcd records: how long they
	// outlive a node that dies. Default 5 s.
	LeaseTTL time.Duration
	// LocationFlushGap is the least time between two batches of the
	// node's block locations written to etcd, which bounds the write
	// load each node puts on etcd at one batch per gap; a change after a
	// quiet spell goes out within 5 ms. Other nodes see a new block or
	// an eviction up to this much later. Default 50 ms; negative: no
	// gap (a batch every 5 ms under load).
	LocationFlushGap time.Duration
	// GossipAddr is host:port for gossip (UDP and TCP). Default: the
	// listen host, a free port.
	GossipAddr string
	// GossipProbeInterval sets gossip's failure detection; a dead node is
	// noticed after about 5 intervals. Default 200 ms.
	GossipProbeInterval time.Duration
	// AdvertiseAddr is the address other nodes and clients reach this node
	// at. Default: the bound listen address.
	AdvertiseAddr string
	// Zone is a free-form failure domain shown to operators; copies of a
	// block go to other zones first.
	Zone string
}

// TransferConfig configures how the node moves blocks to and from peers.
type TransferConfig struct {
	// Transport is how this node pulls blocks from peers: tcp (framed,
	// striped over TransferConns connections), grpc (streams with a
	// raw-bytes codec) or shm (peers on the same host, by HostID, are read
	// through their mapped segment; others over tcp). The node serves all
	// three; shm needs shared memory on. Default tcp.
	Transport transfer.Protocol
	// TransferConns is how many connections the tcp transport keeps per
	// peer. Default 2.
	TransferConns int
	// ServeSendBufferBytes is the send buffer (SO_SNDBUF; Linux caps it
	// at net.core.wmem_max, then doubles it) of the tcp transport
	// connections this node accepts, which carry the bytes of its peers'
	// reads. With the kernel's autotuned buffer a holder could queue a
	// whole 2 MiB block in one write before its peer read a byte, and
	// where the two share processors (nodes on one host, two vCPUs) the
	// reader then waited for the writer to finish: a single-block fetch
	// moved its bytes in two passes instead of one. A buffer that holds
	// part of a block makes the writer wait for the reader instead.
	// Measured on loopback, two vCPUs, interleaved, four runs each:
	// single-block fetches moved at 0.59, 0.60, 0.68 and 0.84 of raw
	// TCP with autotuning, 0.70, 0.72, 0.72 and 0.76 with 512 KiB;
	// chains of 16 and 64 blocks alike either way (0.86–0.97;
	// docs/benchmarks-history.md). A connection whose bandwidth × round
	// trip exceeds the doubled buffer needs it larger. A stock kernel's
	// net.core.wmem_max (212992) holds the default to 416 KiB in all,
	// about 80 Gbit/s per connection at a 40 µs round trip: raise
	// wmem_max for faster links, or leave the buffer to autotuning,
	// which wmem_max does not cap.
	// Default 512 KiB; negative leaves the kernel's autotuning.
	ServeSendBufferBytes int64
	// FetchTimeout bounds one holder's transfer during a Fetch; past it
	// the next holder is tried, or the caller gets Unavailable. Default 1 s.
	FetchTimeout time.Duration
	// Links seeds and tunes the per-link bandwidth estimates.
	Links transfer.LinkConfig
	// WrapTransport, when set, wraps the transport the node pulls with
	// (fault injection in tests: transfer.Faulty).
	WrapTransport func(transfer.Transport) transfer.Transport
}

// PlanConfig configures what Estimate and Plan assume.
type PlanConfig struct {
	// Model is the model profile Estimate and Plan assume when a request
	// names none. It must be in Profiles. Default "llama3-8b".
	Model string
	// Accelerator names this node's engine hardware ("h200"); with a
	// request's model it picks the node's prefill curve, and it is
	// published in the node record so every daemon plans with it.
	// Default "h200".
	Accelerator string
	// BlockTokens is how many tokens one chain key covers, for Estimate
	// and Plan requests that do not say. Default 16 (vLLM's block size).
	BlockTokens int
	// Profiles are the model profiles and prefill curves the cost model
	// reads. Default: the built-in ones (cost.NewProfiles). The node only
	// reads it; do not modify it after New.
	Profiles *cost.Profiles
	// EngineEvents are this node's engines' KV event streams (vLLM's
	// kv_events_config): the node follows them, and plans for itself with
	// the prefix its engines hold in GPU memory. None: the engines' caches
	// are not known, and every local block counts as usable at once.
	EngineEvents []engines.EngineConfig
	// HostToGPUBytesPerSecond is this node's host-to-GPU copy rate, which
	// prices the local blocks its engines' GPUs lack once EngineEvents
	// tell which those are. Default 54.46e9 (pinned copies on an H200,
	// ../shared/anchors).
	HostToGPUBytesPerSecond float64
	// PlacementTTL bounds how long a request a Plan placed (PlanRequest
	// place) counts in its node's queue and cache when the node's engine
	// does not report it sooner. Default 2 s.
	PlacementTTL time.Duration
}

// StoreConfig configures the arena and the block store over it.
type StoreConfig = store.Config

const defaultListenAddr = "127.0.0.1:7070"

// DefaultConfig returns a Config for a node with the given id and capacity
// and every other field at its default.
func DefaultConfig(nodeID string, capacityBytes int64) Config {
	c := Config{NodeID: nodeID}
	c.CapacityBytes = capacityBytes
	c.fillDefaults()
	return c
}

// TestConfig is DefaultConfig on a free loopback port, with short timeouts
// and no metrics listener: what tests that run many nodes in one process
// want.
func TestConfig(nodeID string, capacityBytes int64) Config {
	c := Config{NodeID: nodeID}
	c.CapacityBytes = capacityBytes
	c.ListenAddr = "127.0.0.1:0"
	c.ReservationTimeout = 2 * time.Second
	c.IOTimeout = 5 * time.Second
	c.fillDefaults()
	return c
}

func (c *Config) fillDefaults() {
	c.PersistConfig.fill(c.NodeID, &c.StoreConfig)
	c.StoreConfig = c.StoreConfig.WithDefaults()
	c.ServerConfig.fill(c.NodeID)
	c.SecurityConfig.fill()
	c.ClusterConfig.fill()
	c.TransferConfig.fill()
	c.PlanConfig.fill()
	c.DrainConfig.fill()
	if c.Version == "" {
		c.Version = "dev"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Registerer == nil {
		reg := prometheus.NewRegistry()
		c.Registerer, c.Gatherer = reg, reg
	}
	if c.Gatherer == nil {
		if g, ok := c.Registerer.(prometheus.Gatherer); ok {
			c.Gatherer = g
		} else {
			c.Gatherer = prometheus.DefaultGatherer
		}
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

func (c *ServerConfig) fill(nodeID string) {
	if c.ListenAddr == "" {
		c.ListenAddr = defaultListenAddr
	}
	if c.ShmSocket == "" && !c.DisableShm && nodeID != "" {
		c.ShmSocket = filepath.Join(os.TempDir(), "kvpool-"+nodeID+".sock")
	}
	if c.IOTimeout == 0 {
		c.IOTimeout = 30 * time.Second
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = 10 * time.Minute
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = 2 * time.Second
	}
	if c.MaxConnsPerDoor == 0 {
		c.MaxConnsPerDoor = 16384
	}
	if c.MaxConnsPerRemote == 0 {
		c.MaxConnsPerRemote = 1024
	}
	if c.SpinWait == 0 {
		c.SpinWait = 100 * time.Microsecond
	}
	c.TCPCongestion = wire.CongestionOrDefault(c.TCPCongestion)
	if c.GetChunkBytes == 0 {
		c.GetChunkBytes = 1 << 20
	}
}

func (c *ClusterConfig) fill() {
	if c.MetadataPrefix == "" {
		c.MetadataPrefix = "/kvpool/"
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 5 * time.Second
	}
	if c.GossipProbeInterval == 0 {
		c.GossipProbeInterval = 200 * time.Millisecond
	}
}

func (c *TransferConfig) fill() {
	if c.Transport == 0 {
		c.Transport = transfer.ProtocolTCP
	}
	if c.TransferConns == 0 {
		c.TransferConns = 2
	}
	if c.ServeSendBufferBytes == 0 {
		c.ServeSendBufferBytes = 512 << 10
	}
	if c.FetchTimeout == 0 {
		c.FetchTimeout = time.Second
	}
}

func (c *PlanConfig) fill() {
	if c.Model == "" {
		c.Model = "llama3-8b"
	}
	if c.Accelerator == "" {
		c.Accelerator = cost.DefaultAccelerator
	}
	if c.BlockTokens == 0 {
		c.BlockTokens = 16
	}
	if c.Profiles == nil {
		c.Profiles = cost.NewProfiles()
	}
	if c.HostToGPUBytesPerSecond == 0 {
		c.HostToGPUBytesPerSecond = 54.46e9
	}
	if c.PlacementTTL == 0 {
		c.PlacementTTL = 2 * time.Second
	}
}

// Validate reports every problem with c, after filling defaults in a copy,
// without opening anything: what New would reject. Settings that only
// apply with Etcd set are checked only then.
func (c Config) Validate() error {
	c.fillDefaults()
	return c.validate()
}

// validate reports every problem with c.
func (c *Config) validate() error {
	var errs []error
	if err := api.ValidateName("node id", c.NodeID); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.StoreConfig.Validate())
	errs = append(errs, c.ServerConfig.validate()...)
	errs = append(errs, c.SecurityConfig.validate(c.ListenAddr)...)
	if c.Etcd != nil {
		errs = append(errs, c.ClusterConfig.validate()...)
	}
	errs = append(errs, c.TransferConfig.validate()...)
	errs = append(errs, c.PlanConfig.validate()...)
	errs = append(errs, c.PersistConfig.validate()...)
	errs = append(errs, c.DiskConfig.validate()...)
	errs = append(errs, c.DrainConfig.validate()...)
	if c.Transport == transfer.ProtocolSHM && c.DisableShm {
		errs = append(errs, errors.New("transport shm needs shared memory, which is disabled"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("pool: invalid config: %w", err)
	}
	return nil
}

// DrainConfig configures how the node leaves the cluster (drain.go).
type DrainConfig struct {
	// DrainOnStop drains the node when Run's context ends (SIGTERM)
	// before it stops: what Node.Drain does. Default false: the node
	// stops at once, and its blocks go with it unless a data directory
	// keeps them.
	DrainOnStop bool
	// DrainBudget bounds a drain: handing blocks to peers and waiting for
	// leases together. Keep it below the time the supervisor gives the
	// process to stop (the DaemonSet's terminationGracePeriodSeconds,
	// systemd's TimeoutStopSec). Default 60 s.
	DrainBudget time.Duration
	// DrainChainBlocks is how many blocks one request asks a peer to
	// pull. Default 64.
	DrainChainBlocks int
}

func (c *DrainConfig) fill() {
	if c.DrainBudget == 0 {
		c.DrainBudget = 60 * time.Second
	}
	if c.DrainChainBlocks == 0 {
		c.DrainChainBlocks = 64
	}
}

func (c *DrainConfig) validate() []error {
	var p problems
	if c.DrainBudget < 0 {
		p.add("drain budget %v must not be negative", c.DrainBudget)
	}
	if c.DrainChainBlocks < 1 || c.DrainChainBlocks > wire.MaxChainKeys {
		p.add("drain chain blocks %d: want 1 to %d", c.DrainChainBlocks, wire.MaxChainKeys)
	}
	return p
}

// problems collects a component's configuration errors.
type problems []error

func (p *problems) add(format string, args ...any) { *p = append(*p, fmt.Errorf(format, args...)) }

func (c *ServerConfig) validate() []error {
	var p problems
	if c.IOTimeout < 0 || c.IdleTimeout < 0 || c.HandshakeTimeout < 0 {
		p.add("io, idle and handshake timeouts must not be negative")
	}
	if c.MaxConnsPerDoor < 0 || c.MaxConnsPerRemote < 0 {
		p.add("connection caps must not be negative")
	}
	if c.MaxConnsPerRemote > c.MaxConnsPerDoor {
		p.add("at most %d connections per remote address: more than the %d a door holds", c.MaxConnsPerRemote, c.MaxConnsPerDoor)
	}
	if c.SpinWait > 10*time.Millisecond {
		p.add("spin wait %v: at most 10ms (it is CPU spent per request; negative turns it off)", c.SpinWait)
	}
	if err := wire.ValidateCongestion(c.TCPCongestion); err != nil {
		p = append(p, err)
	}
	if c.GetChunkBytes < 4<<10 || c.GetChunkBytes > 4<<20 {
		p.add("get chunk size %d bytes: want 4 KiB to 4 MiB", c.GetChunkBytes)
	}
	if !c.DisableShm && len(c.transferSocket()) > 107 {
		p.add("shm socket path %q is too long: it and %q must fit the 107 bytes a unix socket allows", c.ShmSocket, c.transferSocket())
	}
	return p
}

// transferSocket is where the shm transport serves this node's segment to
// other nodes on the host: next to ShmSocket.
func (c *ServerConfig) transferSocket() string { return c.ShmSocket + ".transfer" }

func (c *ClusterConfig) validate() []error {
	var p problems
	if c.LeaseTTL < 2*time.Second {
		p.add("lease TTL %v: want at least 2s", c.LeaseTTL)
	}
	if c.LocationFlushGap > c.LeaseTTL/4 {
		p.add("location flush gap %v: want at most a quarter of the lease TTL (%v)", c.LocationFlushGap, c.LeaseTTL/4)
	}
	if c.Zone != "" {
		if err := api.ValidateName("zone", c.Zone); err != nil {
			p = append(p, err)
		}
	}
	return p
}

func (c *TransferConfig) validate() []error {
	var p problems
	switch c.Transport {
	case transfer.ProtocolTCP, transfer.ProtocolGRPC, transfer.ProtocolSHM:
	default:
		p.add("transport %v: want tcp, grpc or shm", c.Transport)
	}
	if c.TransferConns < 1 || c.TransferConns > 64 {
		p.add("transfer connections %d: want 1 to 64", c.TransferConns)
	}
	if c.ServeSendBufferBytes > 0 && (c.ServeSendBufferBytes < 4<<10 || c.ServeSendBufferBytes > 1<<30) {
		p.add("transfer send buffer %d bytes: want 4 KiB to 1 GiB, or off (negative) for the kernel's autotuning", c.ServeSendBufferBytes)
	}
	if c.FetchTimeout < 0 {
		p.add("fetch timeout %v must not be negative", c.FetchTimeout)
	}
	return p
}

func (c *PlanConfig) validate() []error {
	var p problems
	if c.BlockTokens < 1 {
		p.add("block tokens %d: want a positive count", c.BlockTokens)
	}
	if err := api.ValidateName("accelerator", c.Accelerator); err != nil {
		p = append(p, err)
	}
	if _, err := c.Profiles.Model(c.Model); err != nil {
		p = append(p, err)
	} else if _, err := c.Profiles.Curve(c.Model, c.Accelerator); err != nil {
		p = append(p, err)
	}
	if c.PlacementTTL < 0 {
		p.add("placement TTL %v: want ≥ 0", c.PlacementTTL)
	}
	if !(c.HostToGPUBytesPerSecond > 0) || math.IsInf(c.HostToGPUBytesPerSecond, 0) {
		p.add("host-to-GPU rate %v B/s: want a positive number", c.HostToGPUBytesPerSecond)
	}
	if len(c.EngineEvents) > 0 {
		if err := (&engines.Config{Engines: c.EngineEvents}).Validate(); err != nil {
			p = append(p, fmt.Errorf("engine events: %w", err))
		}
	}
	return p
}

package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	"sigs.k8s.io/yaml"

	"github.com/kvpool/kvpool/eviction"
	"github.com/kvpool/kvpool/metadata"
	etcdembed "github.com/kvpool/kvpool/metadata/embedded"
	"github.com/kvpool/kvpool/pool"
	"github.com/kvpool/kvpool/transfer"
	"github.com/kvpool/kvpool/transfer/cost"
)

// fileConfig is the --config file: YAML (or JSON) with the same names as
// the flags, in snake_case. Sizes are strings such as "8GiB", durations
// strings such as "30s". Flags given on the command line win.
type fileConfig struct {
	NodeID             string  `json:"node_id"`
	Listen             string  `json:"listen"`
	MetricsListen      string  `json:"metrics_listen"`
	Capacity           string  `json:"capacity"`
	PageSize           string  `json:"page_size"`
	MaxBlockSize       string  `json:"max_block_size"`
	LockMemory         *bool   `json:"lock_memory"`
	SegmentPath        string  `json:"segment_path"`
	ShmSocket          string  `json:"shm_socket"`
	NoShm              *bool   `json:"no_shm"`
	ReservationTimeout string  `json:"reservation_timeout"`
	IOTimeout          string  `json:"io_timeout"`
	IdleTimeout        string  `json:"idle_timeout"`
	MaxNamespaces      int     `json:"max_namespaces"`
	LogLevel           string  `json:"log_level"`
	LogFormat          string  `json:"log_format"`
	EtcdEndpoints      string  `json:"etcd_endpoints"`
	DataDir            string  `json:"data_dir"`
	EmbeddedEtcdListen string  `json:"embedded_etcd_listen"`
	Standalone         *bool   `json:"standalone"`
	GossipListen       string  `json:"gossip_listen"`
	Advertise          string  `json:"advertise"`
	Zone               string  `json:"zone"`
	LeaseTTL           string  `json:"lease_ttl"`
	Transport          string  `json:"transport"`
	TransferConns      int     `json:"transfer_conns"`
	FetchTimeout       string  `json:"fetch_timeout"`
	LinkSeedRate       string  `json:"link_seed_rate"`
	Model              string  `json:"model"`
	Accelerator        string  `json:"accelerator"`
	BlockTokens        int     `json:"block_tokens"`
	DefaultPolicy      string  `json:"default_policy"`
	HighWatermark      float64 `json:"high_watermark"`
	LowWatermark       float64 `json:"low_watermark"`
	DisableEviction    *bool   `json:"disable_eviction"`
	LeaseDefault       string  `json:"lease_default"`
	LeaseMax           string  `json:"lease_max"`
	// Profiles are files of models and curves; Models and Curves inline.
	Profiles []string     `json:"profiles"`
	Models   []cost.Model `json:"models"`
	Curves   []cost.Curve `json:"curves"`
}

type serveFlags struct {
	configFile string
	nodeID     string
	listen     string
	metrics    string
	capacity   int64
	pageSize   int64
	maxBlock   int64
	lockMemory bool
	segment    string
	shmSocket  string
	noShm      bool
	resTimeout time.Duration
	ioTimeout  time.Duration
	idle       time.Duration
	maxNS      int
	logLevel   string
	logFormat  string
	etcd       string
	dataDir    string
	etcdListen string
	standalone bool
	gossip     string
	advertise  string
	zone       string
	leaseTTL   time.Duration
	transport  string
	xferConns  int
	fetchTO    time.Duration
	seedRate   int64
	model      string
	accel      string
	blockTok   int
	profiles   []string
	defPolicy  string
	high, low  float64
	noEvict    bool
	leaseDef   time.Duration
	leaseMax   time.Duration
}

func serveCmd(e *env) *cobra.Command {
	var f serveFlags
	c := &cobra.Command{
		Use:   "serve",
		Short: "Run a kvpool node",
		Long: `serve runs a kvpool node: a shared-memory arena of --capacity bytes that
engines on this host map directly, with gRPC and the framed data channel on
--listen (one port), same-host clients on the unix socket --shm-socket, and
Prometheus metrics, /healthz and /readyz on --metrics-listen.

Nodes form a cluster through etcd: with --etcd-endpoints the node joins an
existing etcd; without it the node starts an embedded etcd (--data-dir,
--embedded-etcd-listen) that other daemons can join. Each node registers on
a lease (--lease-ttl), publishes where its blocks are, mirrors where every
node's are, and gossips liveness and load on --gossip-listen. --standalone
runs a lone node with none of that.

Settings come from flags, or from a YAML file given with --config whose keys
are the flag names in snake_case (capacity: 8GiB, listen: 0.0.0.0:7070, ...);
flags on the command line override the file. SIGINT or SIGTERM stops the node
gracefully.`,
		Example: `  kvpool serve --capacity 8GiB --node-id gpu-node-1
  kvpool serve --capacity 8GiB --node-id gpu-node-2 --listen 127.0.0.1:7071 --metrics-listen "" --etcd-endpoints http://127.0.0.1:2379
  kvpool serve --listen 0.0.0.0:7070 --metrics-listen 0.0.0.0:7080 --capacity 64GiB --lock-memory
  kvpool serve --config /etc/kvpool/node.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, logCfg, err := f.config(cmd)
			if err != nil {
				return usageError{error: err}
			}
			logger, err := newLogger(e, logCfg[0], logCfg[1])
			if err != nil {
				return usageError{error: err}
			}
			reg := prometheus.NewRegistry()
			reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
			cfg.Registerer, cfg.Gatherer, cfg.Logger, cfg.Version = reg, reg, logger, version
			// Refuse bad settings before starting or joining etcd.
			if err := cfg.Validate(); err != nil {
				return usageError{error: err}
			}
			if !f.standalone {
				cli, stop, err := f.connectEtcd(cfg.NodeID, logger)
				if err != nil {
					return err
				}
				defer stop()
				cfg.Etcd = cli
			}
			n, err := pool.New(cfg)
			if err != nil {
				return err
			}
			defer n.Close()
			logger.Info("kvpool node starting", "node", cfg.NodeID, "listen", n.Addr().String(), "metrics", addrString(n.MetricsAddr()), "shm_socket", n.ShmSocket())
			return n.Run(cmd.Context())
		},
	}
	fl := c.Flags()
	fl.StringVar(&f.configFile, "config", "", "YAML config file; flags given on the command line override it")
	fl.StringVar(&f.nodeID, "node-id", "", "node id, [A-Za-z0-9._-]{1,64} (default: the host name)")
	fl.StringVar(&f.listen, "listen", "127.0.0.1:7070", "address for gRPC and the data channel")
	fl.StringVar(&f.metrics, "metrics-listen", "127.0.0.1:7080", "address for /metrics, /healthz and /readyz; empty disables")
	fl.Var(sizeFlag{&f.capacity}, "capacity", "shared-memory arena size, e.g. 8GiB (required)")
	fl.Var(sizeFlag{&f.pageSize}, "page-size", "allocation granule, a power of two from 512 to 1MiB (default 4KiB)")
	fl.Var(sizeFlag{&f.maxBlock}, "max-block-size", "largest accepted value (default 64MiB, at most the capacity)")
	fl.BoolVar(&f.lockMemory, "lock-memory", false, "pre-fault and mlock the arena (needs CAP_IPC_LOCK or RLIMIT_MEMLOCK)")
	fl.StringVar(&f.segment, "segment-path", "", "back the arena with a new file at this path under /dev/shm instead of a memfd")
	fl.StringVar(&f.shmSocket, "shm-socket", "", "unix socket for same-host clients (default $TMPDIR/kvpool-<node-id>.sock)")
	fl.BoolVar(&f.noShm, "no-shm", false, "do not offer the shared-memory path")
	fl.DurationVar(&f.resTimeout, "reservation-timeout", 30*time.Second, "reclaim reservations not committed within this time")
	fl.DurationVar(&f.ioTimeout, "io-timeout", 30*time.Second, "longest wait for the rest of a started frame or for a write")
	fl.DurationVar(&f.idle, "idle-timeout", 10*time.Minute, "close data connections idle this long")
	fl.IntVar(&f.maxNS, "max-namespaces", 4096, "most distinct (tenant, namespace) pairs the node holds")
	fl.StringVar(&f.etcd, "etcd-endpoints", "", "comma-separated etcd client URLs of an existing cluster; empty starts an embedded etcd")
	fl.StringVar(&f.dataDir, "data-dir", "", "embedded etcd's data directory (default $TMPDIR/kvpool-<node-id>/etcd)")
	fl.StringVar(&f.etcdListen, "embedded-etcd-listen", "127.0.0.1:2379", "where the embedded etcd serves clients; other daemons join with --etcd-endpoints http://ADDR")
	fl.BoolVar(&f.standalone, "standalone", false, "run without etcd or gossip: a single node that publishes nothing")
	fl.StringVar(&f.gossip, "gossip-listen", "", "host:port for gossip, UDP and TCP (default: the --listen host, a free port; published in etcd)")
	fl.StringVar(&f.advertise, "advertise", "", "address other nodes and clients reach this node at (default: the bound --listen address)")
	fl.StringVar(&f.zone, "zone", "", "failure domain shown to operators, [A-Za-z0-9._-]")
	fl.DurationVar(&f.leaseTTL, "lease-ttl", 5*time.Second, "etcd lease of the node's records: how long they outlive a crashed node")
	fl.StringVar(&f.transport, "transport", "tcp", "how the node pulls blocks from peers: tcp, grpc, or shm (peers on this host through shared memory, others over tcp)")
	fl.IntVar(&f.xferConns, "transfer-conns", 2, "tcp transport: connections per peer that one transfer is striped over")
	fl.DurationVar(&f.fetchTO, "fetch-timeout", time.Second, "longest one holder may take to deliver a fetch before the next holder is tried or the caller gets Unavailable")
	fl.StringVar(&f.defPolicy, "default-policy", "lru", "eviction policy of tenants without a stored one: lru, lfu, fifo, ttl or prefix-lru")
	fl.Float64Var(&f.high, "high-watermark", 0.95, "arena fraction past which the node evicts (over-quota tenants and tenants without a quota first)")
	fl.Float64Var(&f.low, "low-watermark", 0.90, "arena fraction the node evicts down to")
	fl.BoolVar(&f.noEvict, "disable-eviction", false, "never evict: puts fail with ResourceExhausted when a quota or the arena is full")
	fl.DurationVar(&f.leaseDef, "lease-default", 10*time.Second, "read lease length when a caller asks for one without saying")
	fl.DurationVar(&f.leaseMax, "lease-max", time.Minute, "longest read lease a caller may take")
	fl.StringVar(&f.model, "model", "llama3-8b", "model profile plans assume when a request names none")
	fl.StringVar(&f.accel, "accelerator", cost.DefaultAccelerator, "this node's engine hardware; picks its prefill curves and is published to the cluster")
	fl.IntVar(&f.blockTok, "block-tokens", 16, "tokens per chain key, for plans that do not say")
	fl.StringSliceVar(&f.profiles, "profiles", nil, "files of extra model profiles and prefill curves (YAML/JSON, or a GPU anchor document); repeatable")
	fl.Var(sizeFlag{&f.seedRate}, "link-seed-rate", "assumed bandwidth of a link not yet measured, in bytes per second, e.g. 1250MB (default 1250MB, 10 Gbit/s)")
	fl.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fl.StringVar(&f.logFormat, "log-format", "text", "text or json")
	return c
}

func addrString(a interface{ String() string }) string {
	if a == nil {
		return ""
	}
	return a.String()
}

// config merges the file and the flags into a pool.Config. Flags set on the
// command line win over the file; the file wins over flag defaults.
func (f *serveFlags) config(cmd *cobra.Command) (pool.Config, [2]string, error) {
	var fc fileConfig
	if f.configFile != "" {
		b, err := os.ReadFile(f.configFile)
		if err != nil {
			return pool.Config{}, [2]string{}, err
		}
		if err := yaml.UnmarshalStrict(b, &fc); err != nil {
			return pool.Config{}, [2]string{}, fmt.Errorf("config %s: %w", f.configFile, err)
		}
	}
	set := cmd.Flags().Changed
	var errs []error
	str := func(flag string, fv *string, file string) {
		if !set(flag) && file != "" {
			*fv = file
		}
	}
	size := func(flag string, fv *int64, file string) {
		if set(flag) || file == "" {
			return
		}
		n, err := parseSize(file)
		if err != nil {
			errs = append(errs, fmt.Errorf("config %s: %w", strings.ReplaceAll(flag, "-", "_"), err))
		}
		*fv = n
	}
	dur := func(flag string, fv *time.Duration, file string) {
		if set(flag) || file == "" {
			return
		}
		d, err := time.ParseDuration(file)
		if err != nil {
			errs = append(errs, fmt.Errorf("config %s: %w", strings.ReplaceAll(flag, "-", "_"), err))
		}
		*fv = d
	}
	boolean := func(flag string, fv *bool, file *bool) {
		if !set(flag) && file != nil {
			*fv = *file
		}
	}
	str("node-id", &f.nodeID, fc.NodeID)
	str("listen", &f.listen, fc.Listen)
	str("metrics-listen", &f.metrics, fc.MetricsListen)
	str("segment-path", &f.segment, fc.SegmentPath)
	str("shm-socket", &f.shmSocket, fc.ShmSocket)
	str("log-level", &f.logLevel, fc.LogLevel)
	str("log-format", &f.logFormat, fc.LogFormat)
	str("etcd-endpoints", &f.etcd, fc.EtcdEndpoints)
	str("data-dir", &f.dataDir, fc.DataDir)
	str("embedded-etcd-listen", &f.etcdListen, fc.EmbeddedEtcdListen)
	str("gossip-listen", &f.gossip, fc.GossipListen)
	str("advertise", &f.advertise, fc.Advertise)
	str("zone", &f.zone, fc.Zone)
	dur("lease-ttl", &f.leaseTTL, fc.LeaseTTL)
	str("transport", &f.transport, fc.Transport)
	dur("fetch-timeout", &f.fetchTO, fc.FetchTimeout)
	size("link-seed-rate", &f.seedRate, fc.LinkSeedRate)
	str("default-policy", &f.defPolicy, fc.DefaultPolicy)
	if !set("high-watermark") && fc.HighWatermark != 0 {
		f.high = fc.HighWatermark
	}
	if !set("low-watermark") && fc.LowWatermark != 0 {
		f.low = fc.LowWatermark
	}
	boolean("disable-eviction", &f.noEvict, fc.DisableEviction)
	dur("lease-default", &f.leaseDef, fc.LeaseDefault)
	dur("lease-max", &f.leaseMax, fc.LeaseMax)
	defKind, err := eviction.ParseKind(f.defPolicy)
	if err != nil {
		errs = append(errs, fmt.Errorf("--default-policy: %w", err))
	}
	str("model", &f.model, fc.Model)
	str("accelerator", &f.accel, fc.Accelerator)
	if !set("block-tokens") && fc.BlockTokens != 0 {
		f.blockTok = fc.BlockTokens
	}
	if !set("profiles") {
		f.profiles = fc.Profiles
	}
	profiles, err := loadProfiles(f.profiles, fc.Models, fc.Curves)
	if err != nil {
		errs = append(errs, err)
	}
	if !set("transfer-conns") && fc.TransferConns != 0 {
		f.xferConns = fc.TransferConns
	}
	boolean("standalone", &f.standalone, fc.Standalone)
	size("capacity", &f.capacity, fc.Capacity)
	size("page-size", &f.pageSize, fc.PageSize)
	size("max-block-size", &f.maxBlock, fc.MaxBlockSize)
	dur("reservation-timeout", &f.resTimeout, fc.ReservationTimeout)
	dur("io-timeout", &f.ioTimeout, fc.IOTimeout)
	dur("idle-timeout", &f.idle, fc.IdleTimeout)
	boolean("lock-memory", &f.lockMemory, fc.LockMemory)
	boolean("no-shm", &f.noShm, fc.NoShm)
	if !set("max-namespaces") && fc.MaxNamespaces != 0 {
		f.maxNS = fc.MaxNamespaces
	}
	if f.nodeID == "" {
		h, err := os.Hostname()
		if err != nil {
			errs = append(errs, errors.New("--node-id is required: the host name is unknown"))
		}
		f.nodeID = h
	}
	if f.capacity == 0 {
		errs = append(errs, errors.New("--capacity is required, e.g. --capacity 8GiB"))
	}
	if len(errs) > 0 {
		return pool.Config{}, [2]string{}, errors.Join(errs...)
	}
	cfg := pool.Config{
		NodeID:             f.nodeID,
		ListenAddr:         f.listen,
		MetricsAddr:        f.metrics,
		ShmSocket:          f.shmSocket,
		DisableShm:         f.noShm,
		CapacityBytes:      f.capacity,
		PageBytes:          f.pageSize,
		MaxBlockBytes:      f.maxBlock,
		LockMemory:         f.lockMemory,
		SegmentPath:        f.segment,
		ReservationTimeout: f.resTimeout,
		IOTimeout:          f.ioTimeout,
		IdleTimeout:        f.idle,
		MaxNamespaces:      f.maxNS,
		GossipAddr:         f.gossip,
		AdvertiseAddr:      f.advertise,
		Zone:               f.zone,
		LeaseTTL:           f.leaseTTL,
		Transport:          f.transport,
		TransferConns:      f.xferConns,
		FetchTimeout:       f.fetchTO,
		Links:              transfer.LinkConfig{SeedBytesPerSecond: float64(f.seedRate)},
		DefaultTenant:      eviction.TenantConfig{Policy: defKind},
		HighWatermark:      f.high,
		LowWatermark:       f.low,
		DisableEviction:    f.noEvict,
		LeaseDefault:       f.leaseDef,
		LeaseMax:           f.leaseMax,
		Model:              f.model,
		Accelerator:        f.accel,
		BlockTokens:        f.blockTok,
		Profiles:           profiles,
	}
	return cfg, [2]string{f.logLevel, f.logFormat}, nil
}

// connectEtcd returns a client to the configured etcd, starting an
// embedded one first when no endpoints are given. stop closes both.
func (f *serveFlags) connectEtcd(nodeID string, log *slog.Logger) (*clientv3.Client, func(), error) {
	endpoints := splitList(f.etcd)
	var embedded *etcdembed.Etcd
	if len(endpoints) == 0 {
		dir := f.dataDir
		if dir == "" {
			dir = filepath.Join(os.TempDir(), "kvpool-"+nodeID, "etcd")
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, nil, err
		}
		url := "http://" + f.etcdListen
		var err error
		embedded, err = etcdembed.Start(etcdembed.Config{Name: nodeID, Dir: dir, ClientURL: url})
		if err != nil {
			return nil, nil, err
		}
		endpoints = []string{embedded.ClientURL()}
		log.Info("embedded etcd serving", "client_url", embedded.ClientURL(), "data_dir", dir,
			"join_with", "--etcd-endpoints "+embedded.ClientURL())
	}
	cli, err := metadata.NewClient(endpoints)
	if err != nil {
		if embedded != nil {
			embedded.Close()
		}
		return nil, nil, fmt.Errorf("etcd %v: %w", endpoints, err)
	}
	return cli, func() {
		cli.Close()
		if embedded != nil {
			embedded.Close()
		}
	}, nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func newLogger(e *env, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(e.stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(e.stderr, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

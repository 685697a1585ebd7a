package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvpool/kvpool/metadata"
	"github.com/kvpool/kvpool/metadata/embedded"
	"github.com/kvpool/kvpool/pool"
	"github.com/kvpool/kvpool/transfer/cost"
)

func nodeServeCmd(e *env) *cobra.Command {
	cfg, o := serveDefaults()
	var configFile string
	var checkConfig bool
	var parseErrs []error
	c := &cobra.Command{
		Use:   "serve",
		Short: "Run a kvpool node",
		Long: `serve runs a kvpool node: a shared-memory arena of --capacity bytes that
engines on this host map directly, with gRPC, the framed data channel and the
tcp transport on --listen (one port), same-host clients on the unix socket
--shm-socket, and Prometheus metrics, /healthz and /readyz on --metrics-listen.

Nodes form a cluster through etcd: with --etcd-endpoints the node joins an
existing etcd; without it the node starts an embedded etcd (in --data-dir,
on --embedded-etcd-listen) that other daemons can join.

With --data-dir the node's blocks outlive it: the arena is a file under
/dev/shm and the data directory holds an index journal of the committed
blocks (synced every --journal-flush-interval). The same command line
started again adopts them, checking each block's CRC before serving it and
republishing the set; --fresh discards them. A different --capacity or
--page-size is refused with a message saying so. Each node registers on
a lease (--lease-ttl), publishes where its blocks are, mirrors where every
node's are, and gossips liveness and load on --gossip-listen. --standalone
runs a lone node with none of that.

Settings come from flags, or from a YAML file given with --config whose keys
are the flag names in snake_case (capacity: 8GiB, listen: 0.0.0.0:7070, ...;
also models: and curves: lists of profiles); flags on the command line
override the file. Every problem with the settings is reported at once, and
exits 2; --check-config stops there, printing the settings that would run
as JSON (exit 0), without starting anything. SIGINT or SIGTERM stops the
node gracefully.`,
		Example: `  kvpool node serve --capacity 8GiB --node-id gpu-node-1
  kvpool node serve --capacity 8GiB --node-id gpu-node-2 --listen 127.0.0.1:7071 --metrics-listen "" --etcd-endpoints http://127.0.0.1:2379
  kvpool node serve --listen 0.0.0.0:7070 --metrics-listen 0.0.0.0:7080 --capacity 64GiB --lock-memory --tls-cert node.pem --tls-key node-key.pem --client-ca ca.pem
  kvpool node serve --capacity 64GiB --node-id gpu-node-1 --data-dir /var/lib/kvpool
  kvpool node serve --config /etc/kvpool/node.yaml
  kvpool node serve --config /etc/kvpool/node.yaml --node-id gpu-node-1 --check-config`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := settle(cmd, e, &cfg, &o, configFile, parseErrs)
			if err != nil {
				return err
			}
			if checkConfig {
				return printJSON(e.stdout, newCheckedSettings(&cfg, &o))
			}
			if !o.standalone {
				cli, stop, err := connectEtcd(&o, cfg.DataDir, cfg.NodeID, logger)
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
	c.Flags().StringVar(&configFile, "config", "", "YAML config file; flags given on the command line override it")
	c.Flags().BoolVar(&checkConfig, "check-config", false, "check the settings (flags and --config), print those that would run as JSON and exit: 0 when they are valid, 2 with every problem when not; the files they name are not opened")
	settingFlags(c.Flags(), &cfg, &o, &parseErrs)
	return c
}

// settle merges the config file into the flags, loads profiles, builds
// the logger and validates everything, reporting every problem at once as
// a usage error: bad settings fail before etcd is started or joined.
func settle(cmd *cobra.Command, e *env, cfg *pool.Config, o *serveOptions, configFile string, parseErrs []error) (*slog.Logger, error) {
	errs := parseErrs
	if configFile != "" {
		errs = append(errs, applyFile(cmd.Flags(), configFile, o))
	}
	if cfg.NodeID == "" {
		h, err := os.Hostname()
		if err != nil {
			errs = append(errs, errors.New("--node-id is required: the host name is unknown"))
		}
		cfg.NodeID = h
	}
	if cfg.CapacityBytes == 0 {
		errs = append(errs, errors.New("--capacity is required, e.g. --capacity 8GiB"))
	}
	profiles, err := loadProfiles(o.profiles, cost.Document{Models: o.models, Curves: o.curves})
	errs = append(errs, err)
	cfg.Profiles = profiles
	logger, err := newLogger(e, o.logLevel, o.logFormat)
	errs = append(errs, err)
	if cfg.CapacityBytes != 0 {
		errs = append(errs, cfg.Validate()) // the node's own checks, all at once
	}
	if err := errors.Join(errs...); err != nil {
		return nil, usage(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg.Registerer, cfg.Gatherer, cfg.Logger, cfg.Version = reg, reg, logger, version
	return logger, nil
}

// loadProfiles returns the built-in profiles plus those in files and the
// inline ones, reporting every problem.
func loadProfiles(files []string, inline cost.Document) (*cost.Profiles, error) {
	p := cost.NewProfiles()
	errs := []error{p.Add(inline)}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err == nil {
			var doc cost.Document
			if doc, err = cost.ParseDocument(file, b); err == nil {
				err = p.Add(doc)
			}
		}
		errs = append(errs, err)
	}
	return p, errors.Join(errs...)
}

func addrString(a interface{ String() string }) string {
	if a == nil {
		return ""
	}
	return a.String()
}

func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

// connectEtcd returns a client to the configured etcd, starting an
// embedded one first when no endpoints are given. stop closes both.
func connectEtcd(o *serveOptions, dataDir, nodeID string, log *slog.Logger) (*clientv3.Client, func(), error) {
	endpoints := o.etcdEndpoints
	var srv *embedded.Etcd
	if len(endpoints) == 0 {
		dir := filepath.Join(dataDir, "etcd")
		switch {
		case o.etcdDataDir != "":
			dir = o.etcdDataDir
		case dataDir == "":
			dir = filepath.Join(os.TempDir(), "kvpool-"+nodeID, "etcd")
		case isDir(filepath.Join(dataDir, "member")):
			// Before the node kept its own state there, --data-dir was
			// the embedded etcd's directory itself: keep using it.
			dir = dataDir
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, nil, err
		}
		var err error
		srv, err = embedded.Start(embedded.Config{Name: nodeID, Dir: dir, ClientURL: "http://" + o.embeddedEtcdListen})
		if err != nil {
			return nil, nil, err
		}
		endpoints = []string{srv.ClientURL()}
		log.Info("embedded etcd serving", "client_url", srv.ClientURL(), "data_dir", dir,
			"join_with", "--etcd-endpoints "+srv.ClientURL())
	}
	ec := metadata.EtcdConfig{Endpoints: endpoints, Username: o.etcdUser}
	if srv == nil {
		var err error
		if ec.TLS, ec.Password, err = etcdCredentials(o); err != nil {
			return nil, nil, err
		}
	}
	cli, err := metadata.NewSecureClient(ec)
	if err != nil {
		if srv != nil {
			srv.Close()
		}
		return nil, nil, fmt.Errorf("etcd %v: %w", endpoints, err)
	}
	return cli, func() {
		cli.Close()
		if srv != nil {
			srv.Close()
		}
	}, nil
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

// etcdCredentials reads --etcd-ca, --etcd-cert, --etcd-key and
// --etcd-password-file.
func etcdCredentials(o *serveOptions) (*tls.Config, string, error) {
	if (o.etcdCert == "") != (o.etcdKey == "") {
		return nil, "", usagef("--etcd-cert and --etcd-key go together")
	}
	if o.etcdCert != "" && o.etcdCA == "" {
		return nil, "", usagef("--etcd-cert needs --etcd-ca")
	}
	cfg, err := clientTLS("--etcd-ca", o.etcdCA, o.etcdCert, o.etcdKey)
	if err != nil {
		return nil, "", err
	}
	password := ""
	if o.etcdPasswordFile != "" {
		b, err := os.ReadFile(o.etcdPasswordFile)
		if err != nil {
			return nil, "", err
		}
		password = strings.TrimSpace(string(b))
	}
	if (o.etcdUser == "") != (password == "") {
		return nil, "", usagef("--etcd-user and --etcd-password-file go together")
	}
	return cfg, password, nil
}

// checkedSettings is what --check-config prints: the settings a node
// would run with, the ones deployment files must agree with (ports,
// paths, sizes, etcd).
type checkedSettings struct {
	NodeID        string   `json:"node_id"`
	Listen        string   `json:"listen"`
	Advertise     string   `json:"advertise,omitempty"`
	MetricsListen string   `json:"metrics_listen"`
	GossipListen  string   `json:"gossip_listen,omitempty"`
	ShmSocket     string   `json:"shm_socket,omitempty"`
	DataDir       string   `json:"data_dir,omitempty"`
	SegmentPath   string   `json:"segment_path,omitempty"`
	CapacityBytes int64    `json:"capacity_bytes"`
	LockMemory    bool     `json:"lock_memory"`
	HugePages     bool     `json:"huge_pages,omitempty"`
	DiskDir       string   `json:"disk_dir,omitempty"`
	DiskCapacity  int64    `json:"disk_capacity_bytes,omitempty"`
	EtcdEndpoints []string `json:"etcd_endpoints,omitempty"`
	Standalone    bool     `json:"standalone"`
	Secured       bool     `json:"secured"`
	// DrainOnStop and DrainBudgetSeconds: what SIGTERM does first.
	DrainOnStop        bool    `json:"drain_on_stop"`
	DrainBudgetSeconds float64 `json:"drain_budget_seconds"`
	// Files are the files the settings name (TLS, tokens, profiles), by
	// setting; --check-config does not open them.
	Files    map[string]string `json:"files,omitempty"`
	ShmAllow []string          `json:"shm_allow,omitempty"`
}

func newCheckedSettings(c *pool.Config, o *serveOptions) checkedSettings {
	s := checkedSettings{
		NodeID: c.NodeID, Listen: c.ListenAddr, Advertise: c.AdvertiseAddr, MetricsListen: c.MetricsAddr, GossipListen: c.GossipAddr,
		ShmSocket: c.ShmSocket, DataDir: c.DataDir, SegmentPath: c.SegmentPath, CapacityBytes: c.CapacityBytes, LockMemory: c.LockMemory, HugePages: c.HugePages,
		DiskDir: c.DiskDir, DiskCapacity: c.DiskCapacityBytes, EtcdEndpoints: o.etcdEndpoints, Standalone: o.standalone,
		Secured: c.TLSCertFile != "" || c.TokenFile != "", ShmAllow: c.ShmAllow, Files: map[string]string{},
		DrainOnStop: c.DrainOnStop, DrainBudgetSeconds: c.DrainBudget.Seconds(),
	}
	for name, path := range map[string]string{"tls_cert": c.TLSCertFile, "tls_key": c.TLSKeyFile, "client_ca": c.ClientCAFile,
		"token_file": c.TokenFile, "peer_token_file": c.PeerTokenFile, "etcd_ca": o.etcdCA, "etcd_cert": o.etcdCert, "etcd_key": o.etcdKey,
		"etcd_password_file": o.etcdPasswordFile} {
		if path != "" {
			s.Files[name] = path
		}
	}
	for i, path := range o.profiles {
		s.Files[fmt.Sprintf("profiles[%d]", i)] = path
	}
	return s
}

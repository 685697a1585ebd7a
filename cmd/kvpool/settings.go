package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"

	"github.com/kvpool/kvpool/api/chain"
	"github.com/kvpool/kvpool/eviction"
	"github.com/kvpool/kvpool/metadata/engines"
	"github.com/kvpool/kvpool/pool"
	"github.com/kvpool/kvpool/transfer"
	"github.com/kvpool/kvpool/transfer/cost"
)

// serveOptions are node serve's settings that are not the node's own:
// how it logs and how it reaches etcd.
type serveOptions struct {
	logLevel, logFormat string
	etcdEndpoints       []string
	etcdDataDir         string
	embeddedEtcdListen  string
	standalone          bool
	profiles            []string
	// From the config file only: inline model profiles and curves.
	models []cost.Model
	curves []cost.Curve

	// TLS and credentials for an external etcd.
	etcdCA, etcdCert, etcdKey  string
	etcdUser, etcdPasswordFile string
}

// setting is one knob of node serve: the flag --name, the config file's
// key name_with_underscores, and the field it sets. Both the flags and the
// file keys are derived from this table, so a new knob is one row here
// (and its field, default and validation in its component's Config).
type setting struct {
	name  string
	usage string
	value func(c *pool.Config, o *serveOptions) pflag.Value
}

var settings = []setting{
	{"node-id", "node id, [A-Za-z0-9._-]{1,64} (default: the host name)", func(c *pool.Config, _ *serveOptions) pflag.Value { return stringV(&c.NodeID) }},
	{"listen", "address for gRPC, the data channel and the tcp transport", func(c *pool.Config, _ *serveOptions) pflag.Value { return stringV(&c.ListenAddr) }},
	{"metrics-listen", "address for /metrics, /healthz and /readyz; empty disables", func(c *pool.Config, _ *serveOptions) pflag.Value { return stringV(&c.MetricsAddr) }},
	{"capacity", "shared-memory arena size, e.g. 8GiB (required)", func(c *pool.Config, _ *serveOptions) pflag.Value { return sizeV(&c.CapacityBytes) }},
	{"page-size", "allocation granule, a power of two from 512 to 1MiB", func(c *pool.Config, _ *serveOptions) pflag.Value { return sizeV(&c.PageBytes) }},
	{"max-block-size", "largest accepted value (default 64MiB, at most the capacity)", func(c *pool.Config, _ *serveOptions) pflag.Value { return sizeV(&c.MaxBlockBytes) }},
	{"lock-memory", "pre-fault and mlock the arena (needs CAP_IPC_LOCK or RLIMIT_MEMLOCK)", func(c *pool.Config, _ *serveOptions) pflag.Value { return boolV(&c.LockMemory) }},
	{"prefault", "allocate every page of the arena at start, so no put pays a page's first write (costs the arena's zeroing up front, about 0.2 s per GiB)", func(c *pool.Config, _ *serveOptions) pflag.Value { return boolV(&c.Prefault) }},
	{"populate-rate", "without --prefault or --lock-memory: bytes per second at which the arena's pages are allocated in the background once the node serves, with at most a quarter of a core, so puts and fetches soon stop paying a page's first write (a copy into untouched shared memory is up to 80x slower); off: never", func(c *pool.Config, _ *serveOptions) pflag.Value { return rateOrOffV(&c.PopulateBytesPerSecond) }},
	{"huge-pages", "back the arena's memfd with huge pages (reserve them first: /proc/sys/vm/nr_hugepages; --capacity a whole number of them). Same-host puts copy into them at the copy's full speed (here 0.95-1.00 of memcpy for 16 MiB blocks, against 0.65-0.71 on small pages). Not with --segment-path or --data-dir: put that file on a hugetlbfs mount instead", func(c *pool.Config, _ *serveOptions) pflag.Value { return boolV(&c.HugePages) }},
	{"segment-path", "back the arena with a file at this path under /dev/shm (or a hugetlbfs mount) instead of a memfd; with --data-dir it is kept across restarts (default then /dev/shm/kvpool-<node-id>-<hash of the data dir>)", func(c *pool.Config, _ *serveOptions) pflag.Value { return stringV(&c.SegmentPath) }},
	{"shm-socket", "unix socket for same-host clients (default $TMPDIR/kvpool-<node-id>.sock)", func(c *pool.Config, _ *serveOptions) pflag.Value { return stringV(&c.ShmSocket) }},
	{"no-shm", "do not offer the shared-memory path", func(c *pool.Config, _ *serveOptions) pflag.Value { return boolV(&c.DisableShm) }},
	{"reservation-timeout", "reclaim reservations not committed within this time", func(c *pool.Config, _ *serveOptions) pflag.Value { return durationV(&c.ReservationTimeout) }},
	{"io-timeout", "longest wait for the rest of a started frame or for a write", func(c *pool.Config, _ *serveOptions) pflag.Value { return durationV(&c.IOTimeout) }},
	{"idle-timeout", "close data connections idle this long, and gRPC connections with no call open", func(c *pool.Config, _ *serveOptions) pflag.Value { return durationV(&c.IdleTimeout) }},
	{"handshake-timeout", "close a new connection on any door that has not sent its first bytes (preamble, HTTP/2 preface, request header) within this time", func(c *pool.Config, _ *serveOptions) pflag.Value { return durationV(&c.HandshakeTimeout) }},
	{"max-conns", "most connections open on each door (tcp port, shm socket, shm transport socket, metrics); more are closed at accept and counted in kvpool_pool_refused_connections_total", func(c *pool.Config, _ *serveOptions) pflag.Value { return intV(&c.MaxConnsPerDoor) }},
	{"max-conns-per-remote", "most connections open from one remote IP address (tcp port and metrics together)", func(c *pool.Config, _ *serveOptions) pflag.Value { return intV(&c.MaxConnsPerRemote) }},
	{"tls-cert", "PEM certificate chain of this node: the TCP port then also serves TLS (gRPC, data channel, transport), told from plaintext by the first byte", func(c *pool.Config, _ *serveOptions) pflag.Value { return stringV(&c.TLSCertFile) }},
	{"tls-key", "PEM key of --tls-cert", func(c *pool.Config, _ *serveOptions) pflag.Value { return stringV(&c.TLSKeyFile) }},
	{"client-ca", "PEM CAs whose client certificates identify callers (spiffe://DOMAIN/tenant/NAME, /node/ID, /admin/NAME URI SANs, or CN tenant:NAME, node:ID, admin:NAME); needs --tls-cert", func(c *pool.Config, _ *serveOptions) pflag.Value { return stringV(&c.ClientCAFile) }},
	{"token-file", "bearer tokens the node accepts, by SHA-256 (lines of NAME IDENTITY sha256:HEX [EXPIRES], as kvpool auth token writes them); re-read within a second of a change", func(c *pool.Config, _ *serveOptions) pflag.Value { return stringV(&c.TokenFile) }},
	{"peer-token-file", "file holding the token this node presents to peers that identify nodes by token", func(c *pool.Config, _ *serveOptions) pflag.Value { return stringV(&c.PeerTokenFile) }},
	{"data-encryption", "which bulk connections to peers run through TLS: always, cross-zone (plaintext with --peer-token-file inside this node's --zone) or never", func(c *pool.Config, _ *serveOptions) pflag.Value { return stringV(&c.DataEncryption) }},
	{"shm-allow", "other users whose processes may use the shared memory of a secured node: UID (trusted with everything) or UID=TENANT (bound to that tenant); repeatable. The node's own user always may", func(c *pool.Config, _ *serveOptions) pflag.Value { return listV(&c.ShmAllow) }},
	{"trust-domain", "SPIFFE trust domain of certificate identities", func(c *pool.Config, _ *serveOptions) pflag.Value { return stringV(&c.TrustDomain) }},
	{"insecure", "allow listening beyond loopback without TLS and credentials: every caller that reaches the node may do everything", func(c *pool.Config, _ *serveOptions) pflag.Value { return boolV(&c.Insecure) }},
	{"no-bench-frames", "refuse the data channel's source and sink frames (the link baselines of node bench --server)", func(c *pool.Config, _ *serveOptions) pflag.Value { return boolV(&c.NoBenchFrames) }},
	{"spin-wait", "how long a data connection polls for the next request before sleeping: saves a thread wake-up per request, costs up to this much CPU per request; positive also runs the mailbox sweeper, one goroutine watching every same-host session's mailbox while posts come close together; negative turns both off", func(c *pool.Config, _ *serveOptions) pflag.Value { return durationV(&c.SpinWait) }},
	{"tcp-congestion", "TCP congestion control of the connections that carry blocks (data channel, tcp transport): a kernel algorithm, or host for the host's default. The default, cubic, avoids BBR's pacing, which stalled bursts after idle time 15-75 ms on loopback", func(c *pool.Config, _ *serveOptions) pflag.Value { return stringV(&c.TCPCongestion) }},
	{"max-namespaces", "most (tenant, namespace) pairs holding blocks or reservations at once (a pair left empty is freed)", func(c *pool.Config, _ *serveOptions) pflag.Value { return intV(&c.MaxNamespaces) }},
	{"etcd-endpoints", "comma-separated etcd client URLs of an existing cluster; empty starts an embedded etcd", func(_ *pool.Config, o *serveOptions) pflag.Value { return listV(&o.etcdEndpoints) }},
	{"etcd-ca", "PEM CA that signed etcd's certificate: talk TLS to --etcd-endpoints (https://)", func(_ *pool.Config, o *serveOptions) pflag.Value { return stringV(&o.etcdCA) }},
	{"etcd-cert", "PEM client certificate for an etcd that requires one (with --etcd-key)", func(_ *pool.Config, o *serveOptions) pflag.Value { return stringV(&o.etcdCert) }},
	{"etcd-key", "PEM key of --etcd-cert", func(_ *pool.Config, o *serveOptions) pflag.Value { return stringV(&o.etcdKey) }},
	{"etcd-user", "etcd user name, for an etcd with authentication on", func(_ *pool.Config, o *serveOptions) pflag.Value { return stringV(&o.etcdUser) }},
	{"etcd-password-file", "file holding the password of --etcd-user", func(_ *pool.Config, o *serveOptions) pflag.Value { return stringV(&o.etcdPasswordFile) }},
	{"data-dir", "the node's state directory: its index journal, so a restart (same command line) keeps the arena's blocks, each checked by CRC before it is served; and the embedded etcd's data under etcd/ (--etcd-data-dir). The arena then lives in a file under /dev/shm (--segment-path). Default: none, blocks die with the process, embedded etcd in $TMPDIR/kvpool-<node-id>/etcd", func(c *pool.Config, _ *serveOptions) pflag.Value { return stringV(&c.DataDir) }},
	{"etcd-data-dir", "the embedded etcd's data directory (default <data-dir>/etcd, or $TMPDIR/kvpool-<node-id>/etcd without --data-dir)", func(_ *pool.Config, o *serveOptions) pflag.Value { return stringV(&o.etcdDataDir) }},
	{"fresh", "with --data-dir: discard the blocks the data directory and its segment hold, and start empty", func(c *pool.Config, _ *serveOptions) pflag.Value { return boolV(&c.Fresh) }},
	{"journal-flush-interval", "with --data-dir: how often the index journal is synced to disk; the blocks committed within it are what a kill -9 can lose (SIGTERM loses none)", func(c *pool.Config, _ *serveOptions) pflag.Value { return durationV(&c.JournalFlushInterval) }},
	{"disk-dir", "a disk tier behind host memory: blocks read at least their tenant's disk_admit_reads times (default 2) are copied here, one self-describing file each, and read back into memory (checked by CRC) when memory has evicted them; kept across restarts. Give the directory to this daemon alone, on a local SSD. Default: none", func(c *pool.Config, _ *serveOptions) pflag.Value { return stringV(&c.DiskDir) }},
	{"disk-capacity", "with --disk-dir: most bytes its block files take, e.g. 4TiB; past it the tier evicts by each tenant's policy (required with --disk-dir)", func(c *pool.Config, _ *serveOptions) pflag.Value { return sizeV(&c.DiskCapacityBytes) }},
	{"disk-io", "with --disk-dir: auto (direct I/O where the file system takes it, else buffered), direct (fail to start without it) or buffered (through the page cache)", func(c *pool.Config, _ *serveOptions) pflag.Value { return &c.DiskIO }},
	{"disk-max-pending", "with --disk-dir: most bytes waiting to be written to disk; they stay pinned in the arena meanwhile, and blocks offered past it are offered again later (default 256MiB, or a quarter of --capacity when that is less)", func(c *pool.Config, _ *serveOptions) pflag.Value { return sizeV(&c.DiskMaxPendingBytes) }},
	{"embedded-etcd-listen", "where the embedded etcd serves clients; other daemons join with --etcd-endpoints http://ADDR", func(_ *pool.Config, o *serveOptions) pflag.Value { return stringV(&o.embeddedEtcdListen) }},
	{"standalone", "run without etcd or gossip: a single node that publishes nothing", func(_ *pool.Config, o *serveOptions) pflag.Value { return boolV(&o.standalone) }},
	{"gossip-listen", "host:port for gossip, UDP and TCP (default: the --listen host, a free port; published in etcd)", func(c *pool.Config, _ *serveOptions) pflag.Value { return stringV(&c.GossipAddr) }},
	{"advertise", "address other nodes and clients reach this node at (default: the bound --listen address)", func(c *pool.Config, _ *serveOptions) pflag.Value { return stringV(&c.AdvertiseAddr) }},
	{"zone", "failure domain shown to operators, [A-Za-z0-9._-]; copies go to other zones first", func(c *pool.Config, _ *serveOptions) pflag.Value { return stringV(&c.Zone) }},
	{"lease-ttl", "etcd lease of the node's records: how long they outlive a crashed node", func(c *pool.Config, _ *serveOptions) pflag.Value { return durationV(&c.LeaseTTL) }},
	{"location-flush-gap", "least time between two batches of this node's block locations written to etcd: under load each node writes at most one per gap, and other nodes see its new blocks and evictions up to this much later (default 50ms; negative: no gap)", func(c *pool.Config, _ *serveOptions) pflag.Value { return durationV(&c.LocationFlushGap) }},
	{"transport", "how the node pulls blocks from peers: tcp, grpc, or shm (peers on this host through shared memory, others over tcp)", func(c *pool.Config, _ *serveOptions) pflag.Value { return textV[transfer.Protocol]{&c.Transport} }},
	{"transfer-conns", "tcp transport: connections per peer that one transfer is striped over", func(c *pool.Config, _ *serveOptions) pflag.Value { return intV(&c.TransferConns) }},
	{"transfer-send-buffer", "tcp transport: the send buffer of the connections peers read this node's blocks over (SO_SNDBUF; the kernel caps it at net.core.wmem_max, 208KiB on a stock kernel, then doubles it). Smaller than a block, it has this node write a block as its peer reads it rather than all at once ahead of it, which on shared processors sped single-block fetches up by a tenth; give links whose bandwidth × round trip exceeds twice this more. off: the kernel's autotuning", func(c *pool.Config, _ *serveOptions) pflag.Value { return sizeOrOffV{v: &c.ServeSendBufferBytes} }},
	{"fetch-timeout", "longest one holder may take to deliver a fetch before the next holder is tried or the caller gets Unavailable", func(c *pool.Config, _ *serveOptions) pflag.Value { return durationV(&c.FetchTimeout) }},
	{"drain-on-stop", "on SIGTERM, drain before stopping: take no new blocks or leases, have peers pull every block only this node holds (leased and hottest first), wait for leases, within --drain-budget; a second SIGTERM stops at once", func(c *pool.Config, _ *serveOptions) pflag.Value { return boolV(&c.DrainOnStop) }},
	{"drain-budget", "longest a drain (--drain-on-stop or kvpool cluster drain) may take; keep it below the time the supervisor waits for the process to stop", func(c *pool.Config, _ *serveOptions) pflag.Value { return durationV(&c.DrainBudget) }},
	{"link-seed-rate", "assumed bandwidth of a link not yet measured, in bytes per second, e.g. 1250MB (default 1250MB, 10 Gbit/s)", func(c *pool.Config, _ *serveOptions) pflag.Value { return sizeV(&c.Links.SeedBytesPerSecond) }},
	{"default-policy", "eviction policy of tenants without a stored one: lru, lfu, fifo, ttl or prefix-lru", func(c *pool.Config, _ *serveOptions) pflag.Value {
		return textV[eviction.Kind]{&c.DefaultTenant.Policy}
	}},
	{"high-watermark", "arena fraction past which the node evicts (over-quota tenants and tenants without a quota first)", func(c *pool.Config, _ *serveOptions) pflag.Value { return floatV(&c.HighWatermark) }},
	{"low-watermark", "arena fraction the node evicts down to", func(c *pool.Config, _ *serveOptions) pflag.Value { return floatV(&c.LowWatermark) }},
	{"disable-eviction", "never evict: puts fail with ResourceExhausted when a quota or the arena is full", func(c *pool.Config, _ *serveOptions) pflag.Value { return boolV(&c.DisableEviction) }},
	{"lease-default", "read lease length when a caller asks for one without saying", func(c *pool.Config, _ *serveOptions) pflag.Value { return durationV(&c.LeaseDefault) }},
	{"lease-max", "longest read lease a caller may take", func(c *pool.Config, _ *serveOptions) pflag.Value { return durationV(&c.LeaseMax) }},
	{"model", "model profile plans assume when a request names none", func(c *pool.Config, _ *serveOptions) pflag.Value { return stringV(&c.Model) }},
	{"accelerator", "this node's engine hardware; picks its prefill curves and is published to the cluster", func(c *pool.Config, _ *serveOptions) pflag.Value { return stringV(&c.Accelerator) }},
	{"block-tokens", "tokens per chain key, for plans that do not say", func(c *pool.Config, _ *serveOptions) pflag.Value { return intV(&c.BlockTokens) }},
	{"kv-events", "follow an engine's KV events (vLLM's kv_events_config) and plan for this node with what it holds in GPU memory: NAME=ENDPOINT[;replay=ENDPOINT][;topic=T][;keying=hashes|sha256:SEED|sha256_cbor:SEED][;tenant=T][;namespace=N] (tenant and namespace: whose plans its GPU cache counts for, default any; keying hashes: the engine's block hashes are kvpool's keys, as with sha256_cbor and the clients' seed; otherwise keys are recomputed from the events' tokens); repeatable or comma-separated", func(c *pool.Config, _ *serveOptions) pflag.Value { return &engineEventsV{p: &c.EngineEvents} }},
	{"host-to-gpu-gbps", "this node's host-to-GPU copy rate in GB/s, which prices local blocks its engines' GPUs lack (with --kv-events)", func(c *pool.Config, _ *serveOptions) pflag.Value { return &gbpsV{p: &c.HostToGPUBytesPerSecond} }},
	{"profiles", "files of extra model profiles and prefill curves (YAML/JSON, or a GPU anchor document); repeatable", func(_ *pool.Config, o *serveOptions) pflag.Value { return listV(&o.profiles) }},
	{"log-level", "debug, info, warn or error", func(_ *pool.Config, o *serveOptions) pflag.Value { return stringV(&o.logLevel) }},
	{"log-format", "text or json", func(_ *pool.Config, o *serveOptions) pflag.Value { return stringV(&o.logFormat) }},
}

// serveDefaults are node serve's defaults: the node's own (pool), and
// those of a daemon an operator runs by hand.
func serveDefaults() (pool.Config, serveOptions) {
	c := pool.DefaultConfig("", 0)
	c.MetricsAddr = "127.0.0.1:7080"
	return c, serveOptions{logLevel: "info", logFormat: "text", embeddedEtcdListen: "127.0.0.1:2379"}
}

// settingFlags registers every setting on fl, bound to c and o. Bad values
// do not stop the parse: they are collected in errs, so every problem of
// a command line is reported at once.
func settingFlags(fl *pflag.FlagSet, c *pool.Config, o *serveOptions, errs *[]error) {
	for _, s := range settings {
		v := &lenient{inner: s.value(c, o), flag: s.name, errs: errs}
		fl.Var(v, s.name, s.usage)
		if v.Type() == "bool" {
			fl.Lookup(s.name).NoOptDefVal = "true"
		}
	}
}

// fileKey is the config file's name for a setting.
func fileKey(name string) string { return strings.ReplaceAll(name, "-", "_") }

// applyFile sets, from the YAML (or JSON) file at path, every setting that
// the command line left alone, and reports every problem at once: unknown
// keys, values that do not parse.
func applyFile(fl *pflag.FlagSet, path string, o *serveOptions) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(j, &doc); err != nil {
		return fmt.Errorf("config %s: want a map of settings: %w", path, err)
	}
	var errs []error
	for _, key := range slices.Sorted(maps.Keys(doc)) {
		raw := doc[key]
		switch key {
		case "models":
			errs = append(errs, jsonField(path, key, raw, &o.models))
			continue
		case "curves":
			errs = append(errs, jsonField(path, key, raw, &o.curves))
			continue
		}
		f := fl.Lookup(strings.ReplaceAll(key, "_", "-"))
		var v *lenient
		if f != nil {
			v, _ = f.Value.(*lenient)
		}
		if v == nil || key != fileKey(f.Name) {
			errs = append(errs, fmt.Errorf("config %s: unknown key %q", path, key))
			continue
		}
		if f.Changed {
			continue // the command line wins
		}
		text, err := scalarText(raw)
		if err == nil {
			err = v.inner.Set(text)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("config %s: %s: %w", path, key, err))
		}
	}
	return errors.Join(errs...)
}

func jsonField(path, key string, raw json.RawMessage, v any) error {
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("config %s: %s: %w", path, key, err)
	}
	return nil
}

// scalarText is a YAML value as a flag would take it: a string as is, a
// number or boolean as written, a list of strings joined with commas.
func scalarText(raw json.RawMessage) (string, error) {
	var x any
	if err := json.Unmarshal(raw, &x); err != nil {
		return "", err
	}
	switch v := x.(type) {
	case string:
		return v, nil
	case float64, bool:
		return string(raw), nil
	case []any:
		parts := make([]string, len(v))
		for i, e := range v {
			var ok bool
			if parts[i], ok = e.(string); !ok {
				return "", fmt.Errorf("want a list of strings, not %s", raw)
			}
		}
		return strings.Join(parts, ","), nil
	}
	return "", fmt.Errorf("want a value, not %s", raw)
}

// lenient is a setting's flag value that records a bad value instead of
// stopping the parse at it.
type lenient struct {
	inner pflag.Value
	flag  string
	errs  *[]error
}

func (l *lenient) String() string { return l.inner.String() }
func (l *lenient) Type() string   { return l.inner.Type() }
func (l *lenient) Set(s string) error {
	if err := l.inner.Set(s); err != nil {
		*l.errs = append(*l.errs, fmt.Errorf("--%s: %w", l.flag, err))
	}
	return nil
}

// Values of pflag's own types, bound to p.
func stringV(p *string) pflag.Value {
	return scratch(func(fs *pflag.FlagSet) { fs.StringVar(p, "v", *p, "") })
}
func boolV(p *bool) pflag.Value {
	return scratch(func(fs *pflag.FlagSet) { fs.BoolVar(p, "v", *p, "") })
}
func intV(p *int) pflag.Value { return scratch(func(fs *pflag.FlagSet) { fs.IntVar(p, "v", *p, "") }) }
func floatV(p *float64) pflag.Value {
	return scratch(func(fs *pflag.FlagSet) { fs.Float64Var(p, "v", *p, "") })
}
func listV(p *[]string) pflag.Value {
	return scratch(func(fs *pflag.FlagSet) { fs.StringSliceVar(p, "v", *p, "") })
}
func durationV(p *time.Duration) pflag.Value {
	return scratch(func(fs *pflag.FlagSet) { fs.DurationVar(p, "v", *p, "") })
}

func scratch(define func(*pflag.FlagSet)) pflag.Value {
	fs := pflag.NewFlagSet("", pflag.ContinueOnError)
	define(fs)
	return fs.Lookup("v").Value
}

// engineEventsV is --kv-events: engine specs, comma-separated or
// repeated.
type engineEventsV struct{ p *[]engines.EngineConfig }

func (v *engineEventsV) Type() string { return "specs" }
func (v *engineEventsV) String() string {
	var out []string
	for _, e := range *v.p {
		out = append(out, e.Name+"="+e.Endpoint)
	}
	return strings.Join(out, ",")
}

func (v *engineEventsV) Set(s string) error {
	for _, spec := range strings.Split(s, ",") {
		spec = strings.TrimSpace(spec)
		if spec == "" {
			continue
		}
		e, err := parseEngineSpec(spec)
		if err != nil {
			return err
		}
		*v.p = append(*v.p, e)
	}
	return nil
}

// parseEngineSpec reads NAME=ENDPOINT[;replay=EP][;topic=T][;keying=K].
func parseEngineSpec(spec string) (engines.EngineConfig, error) {
	parts := strings.Split(spec, ";")
	name, ep, ok := strings.Cut(parts[0], "=")
	if !ok || name == "" || ep == "" {
		return engines.EngineConfig{}, fmt.Errorf("engine %q: want NAME=ENDPOINT[;replay=ENDPOINT][;topic=T][;keying=K][;tenant=T][;namespace=N]", spec)
	}
	e := engines.EngineConfig{Name: name, Endpoint: ep}
	for _, opt := range parts[1:] {
		k, val, _ := strings.Cut(opt, "=")
		switch k {
		case "replay":
			e.Replay = val
		case "topic":
			e.Topic = val
		case "tenant":
			e.Tenant = val
		case "namespace":
			e.Namespace = val
		case "keying":
			if val == "hashes" {
				continue
			}
			scheme, seed, _ := strings.Cut(val, ":")
			sc, err := chain.ParseScheme(scheme)
			if err != nil {
				return engines.EngineConfig{}, fmt.Errorf("engine %s: keying %q: want hashes, sha256:SEED or sha256_cbor:SEED", name, val)
			}
			e.Keying.Chain = chain.Config{Scheme: sc, Seed: seed}
		default:
			return engines.EngineConfig{}, fmt.Errorf("engine %s: unknown option %q (want replay, topic, keying, tenant or namespace)", name, k)
		}
	}
	return e, nil
}

// gbpsV is a rate flag in GB/s (10^9 bytes per second) for a field in
// bytes per second.
type gbpsV struct{ p *float64 }

func (v *gbpsV) Type() string { return "GB/s" }
func (v *gbpsV) String() string {
	if *v.p == 0 {
		return ""
	}
	return strconv.FormatFloat(*v.p/1e9, 'g', -1, 64)
}
func (v *gbpsV) Set(s string) error {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || !(f > 0) {
		return fmt.Errorf("%q: want a positive rate in GB/s", s)
	}
	*v.p = f * 1e9
	return nil
}

// textV is a flag of a type that parses itself (encoding.TextUnmarshaler).
type textV[T any] struct{ p *T }

func (v textV[T]) String() string {
	if s, ok := any(v.p).(fmt.Stringer); ok {
		return s.String()
	}
	return fmt.Sprint(*v.p)
}

func (v textV[T]) Set(s string) error {
	u, ok := any(v.p).(interface{ UnmarshalText([]byte) error })
	if !ok {
		return fmt.Errorf("%T does not parse", *v.p)
	}
	return u.UnmarshalText([]byte(s))
}

func (v textV[T]) Type() string { return "string" }

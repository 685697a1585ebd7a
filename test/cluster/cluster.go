// Package cluster runs kvpool clusters inside a test: an embedded etcd with
// fast elections (or an external one), N daemons on 127.0.0.1:0, and
// cleanup when the test ends. Only tests under test/ import it.
//
//	c := cluster.New(t, cluster.Config{Nodes: 3})
//	cli := c.Client(0)
package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/auth"
	"github.com/kvpool/kvpool/internal/eventually"
	"github.com/kvpool/kvpool/metadata"
	"github.com/kvpool/kvpool/metadata/embedded"
	"github.com/kvpool/kvpool/pool"
)

// Config describes a test cluster.
type Config struct {
	// Nodes is how many daemons to start. Default 3.
	Nodes int
	// CapacityBytes is each node's arena. Default 64 MiB.
	CapacityBytes int64
	// LeaseTTL is the node lease. Default 2 s.
	LeaseTTL time.Duration
	// Endpoints, when set, is an external etcd; otherwise the cluster
	// starts an embedded one.
	Endpoints []string
	// Mutate adjusts node i's config before it starts.
	Mutate func(i int, c *pool.Config)
	// EtcdEndpoints, when set, returns the endpoints node i's etcd client
	// uses (a Proxy, say) instead of the cluster's.
	EtcdEndpoints func(i int, endpoints []string) []string
	// Secure runs every node with mutual TLS (a CA, node certificates,
	// and clients that present an admin's certificate), and the cluster's
	// own etcd with TLS requiring client certificates, as a production
	// cluster would. Also on with KVPOOL_SECURE_CLUSTER=1, so the whole
	// cluster suite can be run secured.
	Secure bool
}

// Cluster is a running test cluster.
type Cluster struct {
	t         testing.TB
	cfg       Config
	pki       string      // with Secure: the directory of the CA and certificates
	clientTLS *tls.Config // with Secure: what Client dials with
	Etcd      *embedded.Etcd
	etcdDir   string
	Endpoints []string
	Nodes     []*Daemon
}

// Daemon is one node of the cluster.
type Daemon struct {
	ID     string
	Node   *pool.Node
	etcd   *clientv3.Client
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	down   atomic.Bool
}

// New starts etcd (unless external) and the daemons, and waits until every
// daemon's mirror knows every node.
func New(t testing.TB, cfg Config) *Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("cluster tests are skipped under -short")
	}
	if cfg.Nodes == 0 {
		cfg.Nodes = 3
	}
	if cfg.CapacityBytes == 0 {
		cfg.CapacityBytes = 64 << 20
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = 2 * time.Second
	}
	cfg.Secure = cfg.Secure || os.Getenv("KVPOOL_SECURE_CLUSTER") == "1"
	c := &Cluster{t: t, cfg: cfg, Endpoints: cfg.Endpoints}
	if cfg.Secure {
		c.makePKI()
	}
	if len(c.Endpoints) == 0 {
		c.etcdDir = t.TempDir()
		if cfg.Secure {
			c.StartEtcd("https://127.0.0.1:0")
		} else {
			c.StartEtcd("http://127.0.0.1:0")
		}
	}
	for i := range cfg.Nodes {
		c.Nodes = append(c.Nodes, c.start(fmt.Sprintf("node-%d", i), i))
	}
	t.Cleanup(func() {
		for _, d := range c.Nodes {
			c.stop(d, true)
		}
		if c.Etcd != nil {
			c.Etcd.Close()
		}
	})
	c.WaitNodes(cfg.Nodes)
	return c
}

// StartEtcd (re)starts the embedded etcd on url with the cluster's data
// directory.
func (c *Cluster) StartEtcd(url string) {
	c.t.Helper()
	ec := embedded.Config{Dir: c.etcdDir, ClientURL: url, Fast: true}
	if c.cfg.Secure {
		// etcd too requires a certificate of every client.
		ec.ClientTLS = &embedded.TLSFiles{CertFile: filepath.Join(c.pki, "etcd.pem"), KeyFile: filepath.Join(c.pki, "etcd-key.pem"),
			TrustedCAFile: filepath.Join(c.pki, "ca.pem"), ClientCertAuth: true}
	}
	e, err := embedded.Start(ec)
	if err != nil {
		c.t.Fatal(err)
	}
	c.Etcd = e
	c.Endpoints = []string{e.ClientURL()}
}

// StopEtcd stops the embedded etcd; StartEtcd(url) brings it back.
func (c *Cluster) StopEtcd() string {
	url := c.Etcd.ClientURL()
	c.Etcd.Close()
	c.Etcd = nil
	return url
}

// Client returns a new etcd client for the cluster, closed at cleanup.
func (c *Cluster) EtcdClient() *clientv3.Client {
	c.t.Helper()
	cli, err := metadata.NewSecureClient(metadata.EtcdConfig{Endpoints: c.Endpoints, TLS: c.etcdTLS()})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { cli.Close() })
	return cli
}

// etcdTLS is how clients reach the cluster's own etcd: with an admin's
// certificate on a Secure cluster; nil (plaintext) otherwise, and for an
// external etcd, which the test started plaintext.
func (c *Cluster) etcdTLS() *tls.Config {
	if !c.cfg.Secure || len(c.cfg.Endpoints) > 0 {
		return nil
	}
	return c.clientTLS
}

func (c *Cluster) start(id string, i int) *Daemon {
	c.t.Helper()
	endpoints := c.Endpoints
	if c.cfg.EtcdEndpoints != nil {
		endpoints = c.cfg.EtcdEndpoints(i, endpoints)
	}
	cli, err := metadata.NewSecureClient(metadata.EtcdConfig{Endpoints: endpoints, TLS: c.etcdTLS()})
	if err != nil {
		c.t.Fatal(err)
	}
	pc := pool.TestConfig(id, c.cfg.CapacityBytes)
	pc.ShmSocket = filepath.Join(os.TempDir(), fmt.Sprintf("kvpool-test-%d-%s.sock", os.Getpid(), id))
	pc.Etcd = cli
	pc.LeaseTTL = c.cfg.LeaseTTL
	pc.Logger = slog.New(slog.NewTextHandler(testWriter{c.t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if c.cfg.Secure {
		if err := c.ca().Issue(c.pki, id, auth.Identity{Role: auth.RoleNode, Name: id}, auth.DefaultTrustDomain, []string{"127.0.0.1"}, true, time.Hour); err != nil {
			c.t.Fatal(err)
		}
		pc.TLSCertFile, pc.TLSKeyFile = filepath.Join(c.pki, id+".pem"), filepath.Join(c.pki, id+"-key.pem")
		pc.ClientCAFile = filepath.Join(c.pki, "ca.pem")
	}
	if c.cfg.Mutate != nil {
		c.cfg.Mutate(i, &pc)
	}
	n, err := pool.New(pc)
	if err != nil {
		cli.Close()
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	d := &Daemon{ID: id, Node: n, etcd: cli, cancel: cancel, done: make(chan error, 1)}
	go func() { d.done <- n.Run(ctx) }()
	<-n.Ready()
	return d
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", p)
	return len(p), nil
}

// stop shuts a daemon down: gracefully (its lease revoked, gossip left), or
// as a crash (nothing said to etcd or gossip; its records expire with the
// lease).
func (c *Cluster) stop(d *Daemon, graceful bool) {
	d.once.Do(func() {
		d.down.Store(true)
		if !graceful {
			d.Node.Gossip().Crash()
			d.etcd.Close() // no revoke: the lease must expire
		}
		d.cancel()
		if err := <-d.done; err != nil {
			c.t.Errorf("%s: %v", d.ID, err)
		}
		d.Node.Close()
		if graceful {
			d.etcd.Close()
		}
	})
}

// Stop shuts node i down gracefully.
func (c *Cluster) Stop(i int) { c.stop(c.Nodes[i], true) }

// Kill stops node i as a crash would.
func (c *Cluster) Kill(i int) { c.stop(c.Nodes[i], false) }

// Restart starts node i again with the same id (after Stop or Kill).
func (c *Cluster) Restart(i int) *Daemon {
	c.t.Helper()
	d := c.start(c.Nodes[i].ID, i)
	c.Nodes[i] = d
	return d
}

// Client dials node i.
func (c *Cluster) Client(i int, path api.Path) *api.Client {
	c.t.Helper()
	cli, err := api.Dial(context.Background(), c.ClientConfig(i, path))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { cli.Close() })
	return cli
}

// ClientConfig is how a client reaches node i: with an admin's
// certificate on a Secure cluster.
func (c *Cluster) ClientConfig(i int, path api.Path) api.ClientConfig {
	return api.ClientConfig{Server: c.Nodes[i].Node.Addr().String(), Path: path, TLS: c.clientTLS}
}

// CLIFlags are the credential flags the CLI needs to reach the cluster's
// nodes: an admin's certificate on a Secure cluster, none otherwise.
func (c *Cluster) CLIFlags() []string {
	if !c.cfg.Secure {
		return nil
	}
	return []string{"--tls-ca", filepath.Join(c.pki, "ca.pem"), "--tls-cert", filepath.Join(c.pki, "admin.pem"), "--tls-key", filepath.Join(c.pki, "admin-key.pem")}
}

// makePKI makes the Secure cluster's CA and the admin certificate its
// clients present.
func (c *Cluster) makePKI() {
	c.t.Helper()
	c.pki = c.t.TempDir()
	ca := c.ca()
	if err := ca.Issue(c.pki, "admin", auth.Identity{Role: auth.RoleAdmin, Name: "test"}, auth.DefaultTrustDomain, nil, false, time.Hour); err != nil {
		c.t.Fatal(err)
	}
	if err := ca.Issue(c.pki, "etcd", auth.Identity{Role: auth.RoleNode, Name: "etcd"}, auth.DefaultTrustDomain, []string{"127.0.0.1"}, true, time.Hour); err != nil {
		c.t.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(c.pki, "admin.pem"), filepath.Join(c.pki, "admin-key.pem"))
	if err != nil {
		c.t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	c.clientTLS = &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
}

func (c *Cluster) ca() *auth.CA {
	ca, err := auth.LoadOrMakeCA(c.pki, time.Hour)
	if err != nil {
		c.t.Fatal(err)
	}
	return ca
}

// WaitNodes waits until every running daemon's mirror lists n nodes.
func (c *Cluster) WaitNodes(n int) {
	c.t.Helper()
	c.Eventually("every mirror to list the nodes", 20*time.Second, func() bool {
		for _, d := range c.Running() {
			if len(d.Node.Mirror().Nodes()) != n {
				return false
			}
		}
		return true
	})
}

// Running lists the daemons not stopped.
func (c *Cluster) Running() []*Daemon {
	var out []*Daemon
	for _, d := range c.Nodes {
		if !d.down.Load() {
			out = append(out, d)
		}
	}
	return out
}

// Converged waits until every running daemon has written all its changes
// to etcd and every running daemon's mirror equals what etcd then holds,
// and returns that content.
func (c *Cluster) Converged(within time.Duration) []string {
	c.t.Helper()
	cli := c.EtcdClient()
	var want []string
	c.Eventually("every mirror to equal etcd", within, func() bool {
		for _, d := range c.Running() {
			if d.Node.Member().Pending() != 0 {
				return false
			}
		}
		var err error
		want, _, err = metadata.ReadContent(context.Background(), cli, "/kvpool/")
		if err != nil {
			return false
		}
		for _, d := range c.Running() {
			if !slices.Equal(d.Node.Mirror().Content(), want) {
				return false
			}
		}
		return true
	})
	return want
}

// Eventually waits until cond holds, failing the test when within passes
// first (eventually.True, for the cluster's test).
func (c *Cluster) Eventually(what string, within time.Duration, cond func() bool) {
	c.t.Helper()
	eventually.True(c.t, what, within, cond)
}

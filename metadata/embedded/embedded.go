// Package embedded runs an etcd server inside this process: the metadata
// store of a single machine (kvpool serve without --etcd-endpoints, the
// demo) and of in-process test clusters.
//
// It is a package of its own because go.etcd.io/etcd/server/v3 is large
// (raft, bbolt, the gRPC gateway) and a daemon library only ever talks to
// etcd as a client: package metadata imports the etcd client alone, so
// every program that links pool, but never starts a server, stays free of
// it. Only cmd and tests import this package; a dependency test in
// metadata keeps it that way.
package embedded

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Config configures an etcd server inside this process.
type Config struct {
	// Name is the member's name. Default "kvpool".
	Name string
	// Dir holds etcd's data (the write-ahead log and the bbolt database);
	// an existing one is reopened. Required.
	Dir string
	// ClientURL is where clients connect, e.g. "http://127.0.0.1:2379";
	// port 0 picks a free one (read it back with Etcd.ClientURL). Default
	// "http://127.0.0.1:2379".
	ClientURL string
	// PeerURL is where members talk to each other. Default
	// "http://127.0.0.1:0": a port nobody is told about, for a cluster of
	// one.
	PeerURL string
	// InitialCluster lists the members as "name=peerURL,...". Default
	// just this member (Name=PeerURL). With several members, PeerURL must
	// name a concrete port.
	InitialCluster string
	// ClusterState is "new" to bootstrap a cluster or "existing" to join
	// one. Default "new".
	ClusterState string
	// Fast uses 10 ms heartbeats and 100 ms elections, electing a leader
	// in tens of milliseconds instead of about a second. For tests.
	// Default false: etcd's 100 ms and 1 s.
	Fast bool
	// AutoCompactRevisions is how many revisions of history etcd keeps;
	// older ones are compacted every few minutes. Default (0) 10000;
	// negative disables compaction.
	AutoCompactRevisions int
	// StartTimeout bounds how long Start waits for the server to serve
	// clients. Default 60 s.
	StartTimeout time.Duration
	// ClientTLS, when set, serves clients over TLS (the client URL's
	// scheme is then https).
	ClientTLS *TLSFiles
}

// TLSFiles are the PEM files of a TLS server.
type TLSFiles struct {
	CertFile, KeyFile string
	// TrustedCAFile verifies client certificates; with ClientCertAuth
	// every client must present one.
	TrustedCAFile  string
	ClientCertAuth bool
}

// Etcd is a running embedded etcd server. Its methods are safe for
// concurrent use.
type Etcd struct {
	etcd  *embed.Etcd
	url   string
	close sync.Once
}

// Start starts etcd and waits until it serves clients. The caller MUST
// call Close, which stops the server and every goroutine it started.
func Start(cfg Config) (*Etcd, error) {
	if cfg.Dir == "" {
		return nil, errors.New("embedded: etcd needs a data dir")
	}
	if cfg.Name == "" {
		cfg.Name = "kvpool"
	}
	if cfg.ClientURL == "" {
		cfg.ClientURL = "http://127.0.0.1:2379"
	}
	if cfg.PeerURL == "" {
		cfg.PeerURL = "http://127.0.0.1:0"
	}
	if cfg.ClusterState == "" {
		cfg.ClusterState = "new"
	}
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = 60 * time.Second
	}
	if cfg.AutoCompactRevisions == 0 {
		cfg.AutoCompactRevisions = 10000
	}
	cu, err := url.Parse(cfg.ClientURL)
	if err != nil {
		return nil, fmt.Errorf("embedded: client URL %q: %w", cfg.ClientURL, err)
	}
	pu, err := url.Parse(cfg.PeerURL)
	if err != nil {
		return nil, fmt.Errorf("embedded: peer URL %q: %w", cfg.PeerURL, err)
	}
	ec := embed.NewConfig()
	ec.Name = cfg.Name
	ec.Dir = cfg.Dir
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	ec.InitialCluster = cfg.InitialCluster
	if ec.InitialCluster == "" {
		ec.InitialCluster = cfg.Name + "=" + cfg.PeerURL
	}
	ec.ClusterState = cfg.ClusterState
	// Location batches are up to a few hundred KB and a registration is a
	// transaction of a few ops; these leave room for both.
	ec.MaxTxnOps = 4096
	ec.MaxRequestBytes = 8 << 20
	ec.QuotaBackendBytes = 8 << 30
	if cfg.AutoCompactRevisions > 0 {
		ec.AutoCompactionMode = embed.CompactorModeRevision
		ec.AutoCompactionRetention = fmt.Sprint(cfg.AutoCompactRevisions)
	}
	if cfg.Fast {
		ec.TickMs, ec.ElectionMs = 10, 100
	}
	scheme := "http://"
	if t := cfg.ClientTLS; t != nil {
		ec.ClientTLSInfo = transport.TLSInfo{CertFile: t.CertFile, KeyFile: t.KeyFile, TrustedCAFile: t.TrustedCAFile, ClientCertAuth: t.ClientCertAuth}
		scheme = "https://"
	}
	// etcd logs a great deal, and three harmless errors on every close.
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	ec.LogLevel = "fatal"
	e, err := embed.StartEtcd(ec)
	if err != nil {
		return nil, fmt.Errorf("embedded: start etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedded: etcd: %w", err)
	case <-time.After(cfg.StartTimeout):
		e.Server.Stop()
		e.Close()
		return nil, fmt.Errorf("embedded: etcd not ready within %v", cfg.StartTimeout)
	}
	return &Etcd{etcd: e, url: scheme + e.Clients[0].Addr().String()}, nil
}

// ClientURL is the URL clients connect to, with the port the server
// listens on (also when Config.ClientURL asked for port 0).
func (e *Etcd) ClientURL() string { return e.url }

// PeerURL is the URL other members connect to, with the port the server
// listens on.
func (e *Etcd) PeerURL() string { return "http://" + e.etcd.Peers[0].Addr().String() }

// Close stops the server and waits for its goroutines to exit. Clients
// still connected see their requests fail. It is idempotent and always
// returns nil.
func (e *Etcd) Close() error {
	// NB: embed.Etcd.Close is not idempotent: a second call closes its
	// error channel again and panics.
	e.close.Do(e.etcd.Close)
	return nil
}

// Wait blocks until the server is ready to serve clients (it joined its
// cluster and saw a leader), or until ctx is done, and returns ctx's error
// then. Start returns only a ready server, so Wait returns nil at once on
// any Etcd; it does not wait for a new leader after the cluster lost one.
func (e *Etcd) Wait(ctx context.Context) error {
	select {
	case <-e.etcd.Server.ReadyNotify():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

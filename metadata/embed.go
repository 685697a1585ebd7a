package metadata

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// EmbedConfig configures an etcd server inside this process, for a single
// machine or for tests.
type EmbedConfig struct {
	// Name of the member. Default "kvpool".
	Name string
	// Dir holds etcd's data. Required.
	Dir string
	// ClientURL is where clients connect, e.g. "http://127.0.0.1:2379"; port
	// 0 picks one (see Embedded.ClientURL). Default http://127.0.0.1:2379.
	ClientURL string
	// PeerURL is where members talk to each other. Default
	// http://127.0.0.1:0 (no other members).
	PeerURL string
	// InitialCluster lists the members as "name=peerURL,...". Default just
	// this member. With several members, PeerURL must be concrete.
	InitialCluster string
	// ClusterState is "new" or "existing". Default "new".
	ClusterState string
	// Fast uses 10 ms heartbeats and 100 ms elections: leader election in
	// tens of milliseconds instead of about a second. For tests.
	Fast bool
	// AutoCompactRevisions keeps this many revisions of history, compacting
	// older ones every few minutes. Default 10000. 0 after filling keeps
	// the default; negative disables.
	AutoCompactRevisions int
	// StartTimeout bounds how long Start waits for the server to serve.
	// Default 60 s.
	StartTimeout time.Duration
}

// Embedded is a running embedded etcd server.
type Embedded struct {
	etcd *embed.Etcd
	url  string
}

// StartEmbedded starts etcd and waits until it serves clients.
func StartEmbedded(cfg EmbedConfig) (*Embedded, error) {
	if cfg.Dir == "" {
		return nil, errors.New("metadata: embedded etcd needs a data dir")
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
		return nil, fmt.Errorf("metadata: client URL %q: %w", cfg.ClientURL, err)
	}
	pu, err := url.Parse(cfg.PeerURL)
	if err != nil {
		return nil, fmt.Errorf("metadata: peer URL %q: %w", cfg.PeerURL, err)
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
	// etcd logs a great deal, and three harmless errors on every close.
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	ec.LogLevel = "fatal"
	e, err := embed.StartEtcd(ec)
	if err != nil {
		return nil, fmt.Errorf("metadata: start embedded etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("metadata: embedded etcd: %w", err)
	case <-time.After(cfg.StartTimeout):
		e.Server.Stop()
		e.Close()
		return nil, fmt.Errorf("metadata: embedded etcd not ready within %v", cfg.StartTimeout)
	}
	return &Embedded{etcd: e, url: "http://" + e.Clients[0].Addr().String()}, nil
}

// ClientURL is the URL clients connect to.
func (e *Embedded) ClientURL() string { return e.url }

// PeerURL is the URL other members connect to.
func (e *Embedded) PeerURL() string { return "http://" + e.etcd.Peers[0].Addr().String() }

// Close stops the server.
func (e *Embedded) Close() error {
	e.etcd.Close()
	return nil
}

// Wait waits up to d for the server to have a leader, e.g. after a member of
// a cluster restarted.
func (e *Embedded) Wait(ctx context.Context) error {
	select {
	case <-e.etcd.Server.ReadyNotify():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

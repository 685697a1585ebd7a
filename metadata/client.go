package metadata

import (
	"crypto/tls"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// NewClient connects to etcd the way daemons should: reconnection backoff
// capped at 2 s (gRPC's default grows to 2 minutes, which would keep a
// daemon away from an etcd that came back long after it did), and etcd's
// own chatty client logging off (the daemon logs what matters).
func NewClient(endpoints []string) (*clientv3.Client, error) {
	return NewSecureClient(EtcdConfig{Endpoints: endpoints})
}

// EtcdConfig says how to reach etcd.
type EtcdConfig struct {
	// Endpoints are etcd's client URLs (https:// with TLS).
	Endpoints []string
	// TLS, when set, talks TLS to etcd: RootCAs verifies it, Certificates
	// is the client certificate when etcd requires one.
	TLS *tls.Config
	// Username and Password, when set, authenticate to etcd's own auth.
	Username, Password string
}

// NewSecureClient is NewClient with TLS and credentials.
func NewSecureClient(c EtcdConfig) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:   c.Endpoints,
		TLS:         c.TLS,
		Username:    c.Username,
		Password:    c.Password,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
			MinConnectTimeout: 2 * time.Second,
		})},
	})
}

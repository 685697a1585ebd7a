package bench

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/auth"
	"github.com/kvpool/kvpool/pool"
)

// AuthModes are the ways a client reaches a node that RunAuth compares,
// in the order it reports them.
var AuthModes = []string{"open", "token", "tls"}

// AuthResult compares one workload (cfg.Op on the data channel) on an open
// node, on a secured node with a token over plaintext, and on the secured
// node with a client certificate over TLS, in one run with the modes'
// rounds interleaved.
type AuthResult struct {
	Op         string  `json:"op"`
	BlockBytes int     `json:"block_bytes"`
	Clients    int     `json:"clients"`
	Rounds     int     `json:"rounds"`
	Modes      []Mode  `json:"modes"`
	TokenRatio float64 `json:"token_vs_open"` // token GB/s over open GB/s
	TLSRatio   float64 `json:"tls_vs_token"`  // tls GB/s over token GB/s
}

// Mode is one mode's totals over every round.
type Mode struct {
	Name  string  `json:"name"`
	GBps  float64 `json:"gbps"`
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
}

// RunAuth measures what authentication and TLS cost on the data channel.
// It starts two in-process nodes (one open, one with TLS, a client CA and
// a token file made in a temporary directory) and, per round, measures
// cfg.Duration of each mode, the order rotating so drift hits all three.
func RunAuth(ctx context.Context, cfg Config) (*AuthResult, error) {
	cfg.Path = api.PathData
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kvpool-bench-auth-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	ca, err := auth.LoadOrMakeCA(dir, 24*time.Hour)
	if err != nil {
		return nil, err
	}
	tenant := auth.Identity{Role: auth.RoleTenant, Tenant: cfg.Tenant}
	if err := ca.Issue(dir, "node", auth.Identity{Role: auth.RoleNode, Name: "bench-secure"}, auth.DefaultTrustDomain, []string{"127.0.0.1"}, true, 24*time.Hour); err != nil {
		return nil, err
	}
	if err := ca.Issue(dir, "tenant", tenant, auth.DefaultTrustDomain, nil, false, 24*time.Hour); err != nil {
		return nil, err
	}
	token, line, err := auth.NewToken("bench", tenant, time.Time{})
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "tokens"), []byte(line+"\n"), 0o600); err != nil {
		return nil, err
	}
	open, stopOpen, err := startNodeWith("bench-open", cfg, pool.SecurityConfig{})
	if err != nil {
		return nil, err
	}
	defer stopOpen()
	secured, stopSecured, err := startNodeWith("bench-secure", cfg, pool.SecurityConfig{
		TLSCertFile: filepath.Join(dir, "node.pem"), TLSKeyFile: filepath.Join(dir, "node-key.pem"),
		ClientCAFile: filepath.Join(dir, "ca.pem"), TokenFile: filepath.Join(dir, "tokens")})
	if err != nil {
		return nil, err
	}
	defer stopSecured()
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "tenant.pem"), filepath.Join(dir, "tenant-key.pem"))
	if err != nil {
		return nil, err
	}
	configs := map[string]api.ClientConfig{
		"open":  {Server: open.Addr().String()},
		"token": {Server: secured.Addr().String(), Token: token},
		"tls":   {Server: secured.Addr().String(), TLS: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}},
	}
	clients := map[string][]*api.Client{}
	for _, m := range AuthModes {
		for range cfg.Clients {
			cc := configs[m]
			cc.Path, cc.MaxIdleConns = api.PathData, 2
			c, err := api.Dial(ctx, cc)
			if err != nil {
				return nil, fmt.Errorf("bench: dial for %s: %w", m, err)
			}
			defer c.Close()
			clients[m] = append(clients[m], c)
		}
	}
	blocks := int(max(cfg.WorkingSetBytes/int64(cfg.BlockBytes), 1))
	keys := make([]api.BlockKey, blocks)
	for i := range keys {
		keys[i] = api.BlockKey{Tenant: cfg.Tenant, Namespace: cfg.Namespace, Key: fmt.Appendf(nil, "bench-%d-%d", cfg.BlockBytes, i)}
	}
	if cfg.Op == "get" {
		for _, m := range []string{"open", "token"} { // token and tls share a node
			if err := populate(ctx, clients[m][0], keys, cfg.BlockBytes, cfg.Progress); err != nil {
				return nil, err
			}
		}
	}
	totals := map[string]*measurement{}
	for _, m := range AuthModes {
		totals[m] = &measurement{}
	}
	for r := range cfg.Rounds {
		for i := range AuthModes {
			m := AuthModes[(i+r)%len(AuthModes)]
			got, err := measure(ctx, cfg, clients[m], keys, r*len(AuthModes)+i)
			if err != nil {
				return nil, fmt.Errorf("bench: %s: %w", m, err)
			}
			totals[m].add(got)
		}
	}
	res := &AuthResult{Op: cfg.Op, BlockBytes: cfg.BlockBytes, Clients: cfg.Clients, Rounds: cfg.Rounds}
	for _, m := range AuthModes {
		var r Result
		totals[m].fill(&r)
		res.Modes = append(res.Modes, Mode{Name: m, GBps: r.GBps, P50Ms: r.P50Ms, P99Ms: r.P99Ms})
	}
	res.TokenRatio = res.Modes[1].GBps / res.Modes[0].GBps
	res.TLSRatio = res.Modes[2].GBps / res.Modes[1].GBps
	return res, nil
}

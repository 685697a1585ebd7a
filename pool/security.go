package pool

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/auth"
	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
)

// SecurityConfig configures who may use the node and how callers prove
// who they are. With neither ClientCAFile nor TokenFile the node runs
// open: every caller may do everything, as before authentication existed
// (allowed on a loopback address only, unless Insecure).
type SecurityConfig struct {
	// TLSCertFile and TLSKeyFile are the node's certificate chain and key
	// (PEM). With them the TCP port also serves TLS, told apart from
	// plaintext by the first byte a client sends; gRPC, the data channel
	// and the tcp transport all run inside it.
	TLSCertFile, TLSKeyFile string
	// ClientCAFile is a PEM bundle of the CAs whose client certificates
	// the node accepts (mutual TLS). A client certificate names its
	// identity in a spiffe://TRUST-DOMAIN/{tenant,node,admin}/NAME URI SAN
	// or a CN of tenant:NAME, node:ID or admin:NAME. Needs TLSCertFile.
	ClientCAFile string
	// TokenFile lists the bearer tokens the node accepts, by SHA-256, with
	// the identity each grants and its expiry (auth.ParseTokens). The node
	// re-reads it within a second of a change, so tokens are added and
	// revoked without a restart.
	TokenFile string
	// TrustDomain is the SPIFFE trust domain of certificate identities.
	// Default "kvpool".
	TrustDomain string
	// Insecure lets the node listen beyond loopback without TLS and
	// credentials.
	Insecure bool
	// PeerTokenFile holds the bearer token this node presents to its
	// peers (on data and transfer connections), for peers that identify
	// nodes by token. With a TLS certificate and a client CA the node also
	// presents its certificate, which must name it as a node.
	PeerTokenFile string
	// DataEncryption says which of this node's bulk connections to peers
	// (pins, reservations and the transfers themselves) run through TLS:
	// "always" (the default), "cross-zone" (only to peers in another zone
	// or of unknown zone; inside a zone, plaintext with the peer token, as
	// RDMA inside a rack is) or "never". Calls from clients are TLS
	// whenever they choose it.
	DataEncryption string
	// ShmAllow lists the other users whose processes may use this node's
	// shared memory, as UID or UID=TENANT; the node's own user always may.
	// A process of a UID=TENANT entry acts for that tenant only (its
	// session may touch no other tenant's blocks); one of a bare UID, like
	// the node's own user, is trusted with everything. Either maps the
	// whole arena: where tenants must not see each other's bytes on one
	// host, run one node per tenant there. Empty: the node's user only
	// (socket mode 0600); otherwise the sockets are 0666 and the uid
	// check is what admits.
	ShmAllow []string
}

// Values of SecurityConfig.DataEncryption.
const (
	EncryptAlways    = "always"
	EncryptCrossZone = "cross-zone"
	EncryptNever     = "never"
)

func (c *SecurityConfig) fill() {
	if c.TrustDomain == "" {
		c.TrustDomain = auth.DefaultTrustDomain
	}
	if c.DataEncryption == "" {
		c.DataEncryption = EncryptAlways
	}
}

// open reports whether the node accepts every caller.
func (c *SecurityConfig) open() bool { return c.ClientCAFile == "" && c.TokenFile == "" }

func (c *SecurityConfig) validate(listen string) []error {
	var p problems
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		p.add("a TLS certificate and its key go together: give both or neither")
	}
	if c.ClientCAFile != "" && c.TLSCertFile == "" {
		p.add("client certificates (a client CA) need the node's own TLS certificate and key")
	}
	if err := api.ValidateName("trust domain", c.TrustDomain); err != nil {
		p.add("%v", err)
	}
	if _, err := parseShmAllow(c.ShmAllow); err != nil {
		p.add("%v", err)
	}
	switch c.DataEncryption {
	case EncryptAlways:
	case EncryptCrossZone, EncryptNever:
		if !c.open() && c.PeerTokenFile == "" {
			p.add("data encryption %q sends bulk bytes to some peers in plaintext, where a node proves who it is with its token: give a peer token file", c.DataEncryption)
		}
	default:
		p.add("data encryption %q: want always, cross-zone or never", c.DataEncryption)
	}
	if !c.Insecure && !isLoopback(listen) && (c.TLSCertFile == "" || c.open()) {
		p.add("listening on %s, beyond loopback, needs TLS (a certificate and key) and credentials (a client CA or a token file); "+
			"give them, or accept running open to the network with --insecure", listen)
	}
	return p
}

// isLoopback reports whether addr (host:port) listens on loopback only.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// gatekeeper identifies callers and applies the access table (auth) at
// every door. Safe for concurrent use; the token set is swapped whole on
// reload.
type gatekeeper struct {
	open        bool
	trustDomain string
	tls         *tls.Config // nil without TLS
	tokenFile   string
	tokens      atomic.Pointer[auth.Tokens] // nil without a token file
	tokenStamp  fileStamp                   // owned by reloadTokens' goroutine
	peerToken   string                      // what this node presents to peers
	shmAllow    map[uint32]string           // other uids on the shm socket → bound tenant
	now         func() time.Time
	log         *slog.Logger
}

func newGatekeeper(c *SecurityConfig, now func() time.Time, log *slog.Logger) (*gatekeeper, error) {
	g := &gatekeeper{open: c.open(), trustDomain: c.TrustDomain, tokenFile: c.TokenFile, now: now, log: log}
	var err error
	if g.shmAllow, err = parseShmAllow(c.ShmAllow); err != nil {
		return nil, fmt.Errorf("pool: %w", err)
	}
	if c.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.TLSCertFile, c.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("pool: TLS certificate: %w", err)
		}
		g.tls = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12,
			// gRPC requires ALPN h2; the data channel and the transport
			// need none.
			NextProtos: []string{"h2"}}
		if c.ClientCAFile != "" {
			pem, err := os.ReadFile(c.ClientCAFile)
			if err != nil {
				return nil, fmt.Errorf("pool: client CA: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("pool: client CA %s holds no PEM certificate", c.ClientCAFile)
			}
			// A client may present a token instead of a certificate.
			g.tls.ClientCAs, g.tls.ClientAuth = pool, tls.VerifyClientCertIfGiven
		}
	}
	if c.TokenFile != "" {
		if err := g.reloadTokens(true); err != nil {
			return nil, err
		}
	}
	if c.PeerTokenFile != "" {
		b, err := os.ReadFile(c.PeerTokenFile)
		if err != nil {
			return nil, fmt.Errorf("pool: peer token: %w", err)
		}
		if g.peerToken = strings.TrimSpace(string(b)); g.peerToken == "" {
			return nil, fmt.Errorf("pool: peer token file %s is empty", c.PeerTokenFile)
		}
	}
	return g, nil
}

// peerTLS is the TLS configuration this node dials its peers with: its
// own certificate (naming it a node) and, to verify theirs, the client CA,
// checking that each peer's certificate names a node rather than a host
// name (peers are dialed by address). nil without TLS and a client CA.
func (g *gatekeeper) peerTLS() *tls.Config {
	if g.tls == nil || g.tls.ClientCAs == nil {
		return nil
	}
	roots, domain := g.tls.ClientCAs, g.trustDomain
	return &tls.Config{
		Certificates: g.tls.Certificates,
		MinVersion:   tls.VersionTLS12,
		// NB: not a skipped check: VerifyConnection below verifies the
		// chain against roots and the peer's identity, instead of a host
		// name.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("peer presented no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			if _, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter}); err != nil {
				return err
			}
			id, err := auth.FromCertificate(cs.PeerCertificates[0], domain)
			if err != nil {
				return err
			}
			if id.Role != auth.RoleNode {
				return fmt.Errorf("peer certificate names %v, not a node", id)
			}
			return nil
		},
	}
}

// fileStamp is what reloadTokens compares to see a file changed.
type fileStamp struct {
	mod  time.Time
	size int64
}

// reloadTokens re-reads the token file when it changed since the last
// read. At start (first) an unreadable or bad file is an error; later it
// is logged and the tokens in force stay.
func (g *gatekeeper) reloadTokens(first bool) error {
	fi, err := os.Stat(g.tokenFile)
	if err == nil && !first && (fileStamp{fi.ModTime(), fi.Size()}) == g.tokenStamp {
		return nil
	}
	var toks *auth.Tokens
	if err == nil {
		var f *os.File
		if f, err = os.Open(g.tokenFile); err == nil {
			toks, err = auth.ParseTokens(f)
			f.Close()
		}
	}
	if err != nil {
		if first {
			return fmt.Errorf("pool: token file: %w", err)
		}
		g.log.Warn("token file unreadable or invalid; the tokens read before stay in force", "file", g.tokenFile, "err", err)
		return nil
	}
	g.tokenStamp = fileStamp{fi.ModTime(), fi.Size()}
	g.tokens.Store(toks)
	if !first {
		g.log.Info("token file reloaded", "file", g.tokenFile, "tokens", toks.Len())
	}
	return nil
}

// TokenReloadInterval is how often the node checks its token file.
const TokenReloadInterval = 250 * time.Millisecond

// watchTokens reloads the token file on change until ctx ends.
func (g *gatekeeper) watchTokens(ctx context.Context) {
	if g.tokenFile == "" {
		return
	}
	t := time.NewTicker(TokenReloadInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			g.reloadTokens(false)
		}
	}
}

// identify says who a caller is from its verified TLS state (nil for
// plaintext) and the bearer token it sent ("" for none). A certificate
// wins over a token. On an open node a credential that fails is ignored:
// the caller is anonymous, and anonymous may do everything there.
func (g *gatekeeper) identify(state *tls.ConnectionState, bearer string) (auth.Identity, error) {
	id, err := g.identifyStrict(state, bearer)
	if err != nil && g.open {
		return auth.Identity{}, nil
	}
	return id, err
}

func (g *gatekeeper) identifyStrict(state *tls.ConnectionState, bearer string) (auth.Identity, error) {
	if state != nil && len(state.VerifiedChains) > 0 && len(state.PeerCertificates) > 0 {
		return auth.FromCertificate(state.PeerCertificates[0], g.trustDomain)
	}
	if bearer == "" {
		return auth.Identity{}, nil
	}
	toks := g.tokens.Load()
	if toks == nil {
		return auth.Identity{}, fmt.Errorf("%w: this node accepts no tokens", api.ErrUnauthenticated)
	}
	return toks.Verify(bearer, g.now())
}

// check applies the access table.
func (g *gatekeeper) check(id auth.Identity, op auth.Op, tenant string) error {
	return auth.Authorize(id, op, tenant, g.open)
}

// identityKey carries the caller's identity in a call's context.
type identityKey struct{}

func withIdentity(ctx context.Context, id auth.Identity) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}

// callerOf is the identity the gatekeeper put in ctx; anonymous if none.
func callerOf(ctx context.Context) auth.Identity {
	id, _ := ctx.Value(identityKey{}).(auth.Identity)
	return id
}

// grpcRule is what a gRPC method is, to the access table: its operation,
// and where its request names the tenant whose blocks it touches.
type grpcRule struct {
	op auth.Op
	// public methods (health checks) need no credentials at all.
	public bool
	// tenants returns the tenants req touches; nil for a method on no
	// tenant's blocks. For streams it is applied to the first message.
	tenants func(req any) []string
}

func tenantField(req any) []string {
	if r, ok := req.(interface{ GetTenant() string }); ok {
		return []string{r.GetTenant()}
	}
	if r, ok := req.(interface{ GetKey() *kvpoolv1.BlockKey }); ok {
		return []string{r.GetKey().GetTenant()}
	}
	return []string{""}
}

// authorizeGRPC identifies the caller of a gRPC call and checks it may
// call method; it returns the context the handler runs in.
func (g *gatekeeper) authorizeGRPC(ctx context.Context, method string) (context.Context, auth.Identity, grpcRule, error) {
	rule, ok := grpcRules[method]
	if !ok {
		if g.open {
			return ctx, auth.Identity{}, grpcRule{}, nil
		}
		return ctx, auth.Identity{}, grpcRule{}, fmt.Errorf("%w: method %s is not in the access table", api.ErrPermissionDenied, method)
	}
	if rule.public {
		return ctx, auth.Identity{}, rule, nil
	}
	var state *tls.ConnectionState
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			state = &ti.State
		}
	}
	bearer := ""
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("authorization"); len(v) > 0 {
			bearer, _ = strings.CutPrefix(v[0], "Bearer ")
		}
	}
	id, err := g.identify(state, bearer)
	if err != nil {
		return ctx, id, rule, err
	}
	if rule.tenants == nil {
		if err := g.check(id, rule.op, ""); err != nil {
			return ctx, id, rule, err
		}
	}
	return withIdentity(ctx, id), id, rule, nil
}

// checkTenants applies rule to a request's tenants.
func (g *gatekeeper) checkTenants(id auth.Identity, rule grpcRule, req any) error {
	if rule.tenants == nil || rule.public {
		return nil
	}
	for _, t := range rule.tenants(req) {
		if err := g.check(id, rule.op, t); err != nil {
			return err
		}
	}
	return nil
}

// unaryInterceptor checks every unary call before its handler runs.
func (g *gatekeeper) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	ctx, id, rule, err := g.authorizeGRPC(ctx, info.FullMethod)
	if err == nil {
		err = g.checkTenants(id, rule, req)
	}
	if err != nil {
		return nil, api.ToStatus(err)
	}
	return h(ctx, req)
}

// streamInterceptor checks a stream before its handler runs, and the
// tenant of its first message before the handler sees it.
func (g *gatekeeper) streamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	ctx, id, rule, err := g.authorizeGRPC(ss.Context(), info.FullMethod)
	if err != nil {
		return api.ToStatus(err)
	}
	return h(srv, &checkedStream{ServerStream: ss, ctx: ctx, g: g, id: id, rule: rule})
}

// checkedStream checks the tenant of a stream's first message.
type checkedStream struct {
	grpc.ServerStream
	ctx     context.Context
	g       *gatekeeper
	id      auth.Identity
	rule    grpcRule
	checked bool
}

func (s *checkedStream) Context() context.Context { return s.ctx }

func (s *checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if !s.checked {
		s.checked = true
		if err := s.g.checkTenants(s.id, s.rule, m); err != nil {
			return api.ToStatus(err)
		}
	}
	return nil
}

// tlsStateOf is the TLS state of c's connection; nil for plaintext.
func tlsStateOf(c net.Conn) *tls.ConnectionState {
	if tc := tlsConnOf(c); tc != nil {
		st := tc.ConnectionState()
		return &st
	}
	return nil
}

// tlsConnOf returns the TLS connection under c, if any.
func tlsConnOf(c net.Conn) *tls.Conn {
	for {
		switch v := c.(type) {
		case *tls.Conn:
			return v
		case *prefixConn:
			c = v.Conn
		default:
			return nil
		}
	}
}

// preTLS is the gRPC server's transport credentials: the node's door
// loop has already terminated TLS (on the shared port, after sniffing), so
// the "handshake" only reports the TLS state it found to the interceptors.
type preTLS struct{}

func (preTLS) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if tc := tlsConnOf(c); tc != nil {
		return c, credentials.TLSInfo{State: tc.ConnectionState(), CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}, nil
	}
	return c, insecureInfo{}, nil
}

func (preTLS) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("pool: preTLS is server-side only")
}

func (preTLS) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls-or-plaintext"}
}
func (p preTLS) Clone() credentials.TransportCredentials { return p }
func (preTLS) OverrideServerName(string) error           { return nil }

// insecureInfo is the AuthInfo of a plaintext connection.
type insecureInfo struct{}

func (insecureInfo) AuthType() string { return "insecure" }

// isTLSClientHello reports whether first (a connection's first bytes) is
// a TLS handshake record: content type 22, major version 3.
func isTLSClientHello(first []byte) bool {
	return len(first) >= 2 && first[0] == 0x16 && first[1] == 0x03
}

// peerTLSFor decides, per peer address, whether this node's bulk
// connections to it run through tls (DataEncryption): nil means plaintext,
// where the node identifies itself by its peer token. A peer whose zone is
// unknown gets TLS.
func (n *Node) peerTLSFor(peer *tls.Config) func(addr string) *tls.Config {
	mode, zone := n.cfg.DataEncryption, n.cfg.Zone
	return func(addr string) *tls.Config {
		switch {
		case peer == nil || mode == EncryptNever:
			return nil
		case mode == EncryptCrossZone && zone != "" && n.cluster != nil && n.cluster.zoneOf(addr) == zone:
			return nil
		}
		return peer
	}
}

// parseShmAllow reads SecurityConfig.ShmAllow: uid → the tenant its
// sessions are bound to ("" for none).
func parseShmAllow(entries []string) (map[uint32]string, error) {
	out := map[uint32]string{}
	var errs []error
	for _, e := range entries {
		uidStr, tenant, bound := strings.Cut(e, "=")
		uid, err := strconv.ParseUint(uidStr, 10, 32)
		if err != nil {
			errs = append(errs, fmt.Errorf("shm allow %q: want UID or UID=TENANT", e))
			continue
		}
		if bound {
			if err := api.ValidateName("shm allow tenant", tenant); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		if _, dup := out[uint32(uid)]; dup {
			errs = append(errs, fmt.Errorf("shm allow: uid %d is listed twice", uid))
			continue
		}
		out[uint32(uid)] = tenant
	}
	return out, errors.Join(errs...)
}

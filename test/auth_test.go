package test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/auth"
	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
	"github.com/kvpool/kvpool/api/wire"
	"github.com/kvpool/kvpool/internal/eventually"
	"github.com/kvpool/kvpool/pool"
	"github.com/kvpool/kvpool/test/cluster"
	"github.com/kvpool/kvpool/transfer"
)

// pki is a test cluster's certificates and tokens, made with the CLI
// (kvpool auth certs, kvpool auth token) as an operator would.
type pki struct {
	dir    string
	roots  *x509.CertPool
	tokens string // the node's token file
	bearer map[string]string
}

func makePKI(t *testing.T, nodes ...string) *pki {
	t.Helper()
	p := &pki{dir: t.TempDir(), bearer: map[string]string{}}
	mustOK(t, kv(t, nil, "auth", "certs", "--dir", p.dir, "--node", strings.Join(nodes, ","), "--tenant", "acme,globex", "--admin", "ops"))
	pem, err := os.ReadFile(filepath.Join(p.dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	p.roots = x509.NewCertPool()
	p.roots.AppendCertsFromPEM(pem)
	p.tokens = filepath.Join(p.dir, "tokens")
	for _, g := range [][]string{{"acme-token", "--tenant", "acme"}, {"globex-token", "--tenant", "globex"}, {"ops-token", "--admin"}, {"peer-token", "--node", nodes[0]}} {
		r := mustOK(t, kv(t, nil, append([]string{"auth", "token", "--name", g[0], "--file", p.tokens}, g[1:]...)...))
		p.bearer[g[0]] = strings.TrimSpace(r.stdout)
	}
	return p
}

func (p *pki) file(name string) string { return filepath.Join(p.dir, name) }

// serveArgs are the flags of a node secured with p.
func (p *pki) serveArgs(node string) []string {
	return []string{"--tls-cert", p.file("node-" + node + ".pem"), "--tls-key", p.file("node-" + node + "-key.pem"),
		"--client-ca", p.file("ca.pem"), "--token-file", p.tokens}
}

// clientTLS is TLS to a node of p, with the named client certificate
// ("" for none).
func (p *pki) clientTLS(t *testing.T, cert string) *tls.Config {
	cfg := &tls.Config{RootCAs: p.roots, MinVersion: tls.VersionTLS12}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(p.file(cert+".pem"), p.file(cert+"-key.pem"))
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg
}

// caller is one row of the access table.
type caller struct {
	name  string
	tls   *tls.Config // nil: plaintext
	token string
}

func (c caller) grpcConn(t *testing.T, addr string) *grpc.ClientConn {
	creds := insecure.NewCredentials()
	if c.tls != nil {
		creds = credentials.NewTLS(c.tls)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if c.token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(api.BearerToken(c.token)))
	}
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// outcome names what the door did: "ok" (the call reached its handler,
// whatever that answered), "denied" or "unauth".
func outcome(err error) string {
	switch code := status.Code(err); {
	case code == codes.Unauthenticated || errors.Is(err, api.ErrUnauthenticated):
		return "unauth"
	case code == codes.PermissionDenied || errors.Is(err, api.ErrPermissionDenied):
		return "denied"
	}
	return "ok"
}

// grpcCalls are one call of every gRPC method, on tenant acme's blocks.
func grpcCalls() map[string]func(ctx context.Context, cc *grpc.ClientConn) error {
	acme := &kvpoolv1.BlockKey{Tenant: "acme", Namespace: "n", Key: []byte("probe")}
	keys := [][]byte{[]byte("probe")}
	kv := func(cc *grpc.ClientConn) kvpoolv1.KVPoolServiceClient { return kvpoolv1.NewKVPoolServiceClient(cc) }
	adm := func(cc *grpc.ClientConn) kvpoolv1.AdminServiceClient { return kvpoolv1.NewAdminServiceClient(cc) }
	unary := func(err error) error { return err }
	return map[string]func(ctx context.Context, cc *grpc.ClientConn) error{
		"Put": func(ctx context.Context, cc *grpc.ClientConn) error {
			s, err := kv(cc).Put(ctx)
			if err != nil {
				return err
			}
			s.Send(&kvpoolv1.PutRequest{Msg: &kvpoolv1.PutRequest_Header{Header: &kvpoolv1.PutHeader{Key: acme, SizeBytes: 1}}})
			s.Send(&kvpoolv1.PutRequest{Msg: &kvpoolv1.PutRequest_Chunk{Chunk: []byte("x")}})
			_, err = s.CloseAndRecv()
			return err
		},
		"Get": func(ctx context.Context, cc *grpc.ClientConn) error {
			s, err := kv(cc).Get(ctx, &kvpoolv1.GetRequest{Key: acme})
			if err != nil {
				return err
			}
			_, err = s.Recv()
			return err
		},
		"BatchPut": func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := kv(cc).BatchPut(ctx, &kvpoolv1.BatchPutRequest{Items: []*kvpoolv1.BatchPutItem{{Key: acme, Value: []byte("x")}}})
			return unary(err)
		},
		"BatchGet": func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := kv(cc).BatchGet(ctx, &kvpoolv1.BatchGetRequest{Tenant: "acme", Namespace: "n", Keys: keys})
			return err
		},
		"Exists": func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := kv(cc).Exists(ctx, &kvpoolv1.ExistsRequest{Tenant: "acme", Namespace: "n", Keys: keys})
			return err
		},
		"Locate": func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := kv(cc).Locate(ctx, &kvpoolv1.LocateRequest{Tenant: "acme", Namespace: "n", Keys: keys, Lease: true})
			return err
		},
		"Remove": func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := kv(cc).Remove(ctx, &kvpoolv1.RemoveRequest{Key: &kvpoolv1.BlockKey{Tenant: "acme", Namespace: "n", Key: []byte("absent")}})
			return err
		},
		"Stats": func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := kv(cc).Stats(ctx, &kvpoolv1.StatsRequest{})
			return err
		},
		"Info": func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := kv(cc).Info(ctx, &kvpoolv1.InfoRequest{})
			return err
		},
		"ReportLoad": func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := kv(cc).ReportLoad(ctx, &kvpoolv1.ReportLoadRequest{})
			return err
		},
		"Fetch": func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := kv(cc).Fetch(ctx, &kvpoolv1.FetchRequest{Tenant: "acme", Namespace: "n", Keys: keys})
			return err
		},
		"Route": func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := kv(cc).Route(ctx, &kvpoolv1.RouteRequest{Tenant: "acme", Namespace: "n", Keys: keys})
			return err
		},
		"Estimate": func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := kv(cc).Estimate(ctx, &kvpoolv1.EstimateRequest{Tenant: "acme", Namespace: "n", Keys: keys})
			return err
		},
		"Plan": func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := kv(cc).Plan(ctx, &kvpoolv1.PlanRequest{Tenant: "acme", Namespace: "n", Keys: keys})
			return err
		},
		"admin.ListNodes": func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := adm(cc).ListNodes(ctx, &kvpoolv1.ListNodesRequest{})
			return err
		},
		"admin.ClusterLocate": func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := adm(cc).ClusterLocate(ctx, &kvpoolv1.ClusterLocateRequest{Tenant: "acme", Namespace: "n", Keys: keys})
			return err
		},
		"admin.ListBlocks": func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := adm(cc).ListBlocks(ctx, &kvpoolv1.ListBlocksRequest{})
			return err
		},
		"admin.ClusterStats": func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := adm(cc).ClusterStats(ctx, &kvpoolv1.ClusterStatsRequest{})
			return err
		},
		"admin.ListLinks": func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := adm(cc).ListLinks(ctx, &kvpoolv1.ListLinksRequest{})
			return err
		},
		"admin.GetPolicy": func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := adm(cc).GetPolicy(ctx, &kvpoolv1.GetPolicyRequest{Tenant: "acme"})
			return err
		},
		"admin.ListPolicies": func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := adm(cc).ListPolicies(ctx, &kvpoolv1.ListPoliciesRequest{})
			return err
		},
		"admin.SetPolicy": func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := adm(cc).SetPolicy(ctx, &kvpoolv1.SetPolicyRequest{Policy: &kvpoolv1.TenantPolicy{Tenant: "acme", Policy: "lru"}})
			return err
		},
		"admin.DeletePolicy": func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := adm(cc).DeletePolicy(ctx, &kvpoolv1.DeletePolicyRequest{Tenant: "absent"})
			return err
		},
		// Another node's id: a caller let through is told so, and the
		// node under test keeps serving.
		"admin.Drain": func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := adm(cc).Drain(ctx, &kvpoolv1.DrainRequest{NodeId: "not-this-node"})
			return err
		},
		"transfer.Read": func(ctx context.Context, cc *grpc.ClientConn) error {
			s, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, "/kvpool.transfer.v1.Transfer/Read")
			if err != nil {
				return err
			}
			s.SendMsg(&emptypb.Empty{})
			s.CloseSend()
			return s.RecvMsg(&emptypb.Empty{})
		},
		"health.Check": func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
			return err
		},
	}
}

// dataFrames are one request of every data-channel frame type a client
// may send first, on tenant acme's blocks.
func dataFrames() map[string]func(ctx context.Context, c *wire.Conn) error {
	key := func(op wire.Op) *wire.Request {
		return &wire.Request{Op: op, Tenant: []byte("acme"), Namespace: []byte("n"), Key: []byte("absent")}
	}
	return map[string]func(ctx context.Context, c *wire.Conn) error{
		"data.Get": func(ctx context.Context, c *wire.Conn) error { _, err := c.RoundTrip(ctx, key(wire.OpGet)); return err },
		"data.View": func(ctx context.Context, c *wire.Conn) error {
			_, err := c.RoundTrip(ctx, key(wire.OpView))
			return err
		},
		"data.Remove": func(ctx context.Context, c *wire.Conn) error {
			_, err := c.RoundTrip(ctx, key(wire.OpRemove))
			return err
		},
		"data.Reserve": func(ctx context.Context, c *wire.Conn) error {
			r := key(wire.OpReserve)
			r.ValueLen = 1
			resp, err := c.RoundTrip(ctx, r)
			if err == nil {
				c.Notify(&wire.Request{Op: wire.OpAbort, Handle: resp.Handle}, time.Second)
			}
			return err
		},
		"data.Source": func(ctx context.Context, c *wire.Conn) error {
			_, err := c.RoundTrip(ctx, &wire.Request{Op: wire.OpSource, ValueLen: 1})
			return err
		},
		"data.Commit": func(ctx context.Context, c *wire.Conn) error {
			// Of a reservation this session does not hold: refused as
			// such (FailedPrecondition) once the caller is known.
			_, err := c.RoundTrip(ctx, &wire.Request{Op: wire.OpCommit, Handle: 12345})
			return err
		},
		"data.Fetch": func(ctx context.Context, c *wire.Conn) error {
			// A standalone node answers a chain it lacks with a result
			// per key (NotFound): the frame itself succeeds.
			chain := wire.AppendChain(nil, [][]byte{[]byte("absent")})
			r := key(wire.OpFetch)
			r.Key, r.ValueLen = nil, uint64(len(chain))
			c.Queue(r)
			if err := c.Flush(chain); err == nil {
				if _, err = c.Recv(); err != nil {
					return err
				}
				return c.Discard(c.Response().ValueLen)
			}
			_, err := c.Recv()
			return err
		},
		"data.Put": func(ctx context.Context, c *wire.Conn) error {
			r := key(wire.OpPut)
			r.ValueLen, r.Flags = 1, wire.FlagChecksum
			// A refused put is answered after its header and the
			// connection closed, maybe before the rest is written: the
			// answer is what counts, not the write's error.
			c.Queue(r)
			if err := c.Flush([]byte("x")); err == nil {
				c.QueueTrailer(api.Checksum([]byte("x")))
				c.Flush(nil)
			}
			_, err := c.Recv()
			return err
		},
	}
}

// The access table of a secured node, driven against a daemon process
// with real TLS and certificates and tokens made by the CLI: every gRPC
// method and every first data-channel frame, by every kind of caller, on
// tenant acme's blocks.
func TestAccessTable(t *testing.T) {
	p := makePKI(t, "secure-1")
	s := startServe(t, append([]string{"--standalone", "--capacity", "64MiB", "--node-id", "secure-1"}, p.serveArgs("secure-1")...)...)
	callers := []caller{
		{name: "acme cert", tls: p.clientTLS(t, "tenant-acme")},
		{name: "acme token", tls: p.clientTLS(t, ""), token: p.bearer["acme-token"]},
		{name: "acme token plaintext", token: p.bearer["acme-token"]},
		{name: "globex cert", tls: p.clientTLS(t, "tenant-globex")},
		{name: "node cert", tls: p.clientTLS(t, "node-secure-1")},
		{name: "admin cert", tls: p.clientTLS(t, "admin-ops")},
		{name: "admin token", tls: p.clientTLS(t, ""), token: p.bearer["ops-token"]},
		{name: "anonymous TLS", tls: p.clientTLS(t, "")},
		{name: "anonymous plaintext"},
		{name: "bad token", tls: p.clientTLS(t, ""), token: "kvp_not-a-token"},
	}
	// What the design says, per kind of caller: the calls refused, and how.
	tenantOnly := []string{"admin.ListNodes", "admin.ClusterLocate", "admin.ListBlocks", "admin.ClusterStats", "admin.ListLinks",
		"admin.GetPolicy", "admin.ListPolicies", "admin.SetPolicy", "admin.DeletePolicy", "admin.Drain", "transfer.Read"}
	acmesBlocks := []string{"Put", "Get", "BatchPut", "BatchGet", "Exists", "Locate", "Remove", "Fetch", "Route", "Estimate", "Plan",
		"data.Get", "data.View", "data.Remove", "data.Reserve", "data.Put", "data.Fetch"}
	want := func(c caller, call string) string {
		switch {
		case call == "health.Check":
			return "ok"
		case strings.HasPrefix(c.name, "anonymous"), c.name == "bad token":
			return "unauth"
		case strings.HasPrefix(c.name, "admin"):
			if call == "transfer.Read" {
				return "denied" // raw arena bytes move between nodes only
			}
			return "ok"
		case strings.HasPrefix(c.name, "acme"):
			if slices.Contains(tenantOnly, call) {
				return "denied"
			}
			return "ok"
		case strings.HasPrefix(c.name, "globex"):
			if slices.Contains(tenantOnly, call) || slices.Contains(acmesBlocks, call) {
				return "denied"
			}
			return "ok"
		case strings.HasPrefix(c.name, "node"):
			if strings.HasPrefix(call, "admin.") || call == "Stats" || call == "ReportLoad" {
				return "denied"
			}
			return "ok"
		}
		return "?"
	}
	got := map[string]map[string]string{}
	ctx := context.Background()
	for _, c := range callers {
		got[c.name] = map[string]string{}
		cc := c.grpcConn(t, s.addr)
		for name, call := range grpcCalls() {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			got[c.name][name] = outcome(call(cctx, cc))
			cancel()
		}
		for name, frame := range dataFrames() {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			conn, err := wire.Dial(cctx, s.addr, wire.ConnConfig{Status: api.FromWireStatus, TLS: c.tls, Token: c.token})
			if err != nil {
				t.Fatalf("%s: dial the data channel: %v", c.name, err)
			}
			got[c.name][name] = outcome(frame(cctx, conn))
			conn.Close()
			cancel()
		}
	}
	var calls []string
	for name := range got[callers[0].name] {
		calls = append(calls, name)
	}
	sort.Strings(calls)
	var table strings.Builder
	fmt.Fprintf(&table, "| call |")
	for _, c := range callers {
		fmt.Fprintf(&table, " %s |", c.name)
	}
	fmt.Fprintf(&table, "\n|---|%s\n", strings.Repeat("---|", len(callers)))
	for _, call := range calls {
		fmt.Fprintf(&table, "| %s |", call)
		for _, c := range callers {
			g, w := got[c.name][call], want(c, call)
			if g != w {
				t.Errorf("%s calling %s: %s, want %s", c.name, call, g, w)
			}
			fmt.Fprintf(&table, " %s |", g)
		}
		table.WriteString("\n")
	}
	t.Logf("access table (calls on tenant acme's blocks):\n%s", table.String())

	// A tenant's Stats shows the node's totals and its own tenant only.
	gc := caller{tls: p.clientTLS(t, "tenant-globex")}
	gcl, err := api.Dial(ctx, api.ClientConfig{Server: s.addr, Path: api.PathData, TLS: gc.tls})
	if err != nil {
		t.Fatal(err)
	}
	defer gcl.Close()
	if err := gcl.Put(ctx, api.BlockKey{Tenant: "globex", Namespace: "n", Key: []byte("g")}, []byte("globex's")); err != nil {
		t.Fatal(err)
	}
	st, err := kvpoolv1.NewKVPoolServiceClient(callers[0].grpcConn(t, s.addr)).Stats(ctx, &kvpoolv1.StatsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ts := range st.GetTenants() {
		if ts.GetTenant() != "acme" {
			t.Errorf("acme's Stats shows tenant %s", ts.GetTenant())
		}
	}
	for _, ns := range st.GetNamespaces() {
		if ns.GetTenant() != "acme" {
			t.Errorf("acme's Stats shows namespace %s/%s", ns.GetTenant(), ns.GetNamespace())
		}
	}
	if st.GetBlocks() == 0 {
		t.Error("acme's Stats lacks the node's totals")
	}
}

// A transfer connection (KVPT) without a node identity is refused before
// any byte of the arena moves; a node may read only what it pinned (and
// only while it holds the pin), like an RDMA rkey.
func TestTransferEndpointAdmitsOnlyNodes(t *testing.T) {
	p := makePKI(t, "secure-2", "peer-2")
	s := startServe(t, append([]string{"--standalone", "--capacity", "16MiB", "--node-id", "secure-2"}, p.serveArgs("secure-2")...)...)
	// read asks, as the tcp transport frames it (kind u8, 3 zero bytes,
	// region u32, offset u64, length u64), for length bytes of the arena
	// (region 1) at offset. It returns the response's status, or -1 when
	// the connection closed first.
	read := func(c net.Conn, offset, length uint64) int {
		req := make([]byte, 24)
		req[0] = byte(transfer.Read)
		binary.LittleEndian.PutUint32(req[4:], 1)
		binary.LittleEndian.PutUint64(req[8:], offset)
		binary.LittleEndian.PutUint64(req[16:], length)
		if _, err := c.Write(req); err != nil {
			return -1
		}
		c.SetReadDeadline(time.Now().Add(3 * time.Second))
		var resp [16]byte
		if _, err := io.ReadFull(c, resp[:]); err != nil {
			return -1
		}
		if resp[0] == 0 {
			if _, err := io.ReadFull(c, make([]byte, length)); err != nil {
				return -1
			}
		}
		return int(resp[0])
	}
	dialKVPT := func(tlsConfig *tls.Config, token string) net.Conn {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		c, err := wire.DialPreamble(ctx, s.addr, transfer.TCPPreamble, tlsConfig, token, "")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	for _, tc := range []struct {
		name  string
		tls   *tls.Config
		token string
	}{
		{"plaintext, no identity", nil, ""},
		{"TLS, no client certificate", p.clientTLS(t, ""), ""},
		{"a tenant's certificate", p.clientTLS(t, "tenant-acme"), ""},
		{"an admin's token", nil, p.bearer["ops-token"]},
		{"a forged token", nil, "kvp_forged"},
	} {
		if st := read(dialKVPT(tc.tls, tc.token), 0, 4096); st != -1 {
			t.Errorf("%s: answered with status %d; want the connection closed before any byte", tc.name, st)
		}
	}
	// A block acme stores; peer-2 pins it as a fetching node would.
	acme, err := api.Dial(context.Background(), api.ClientConfig{Server: s.addr, Path: api.PathData, TLS: p.clientTLS(t, "tenant-acme")})
	if err != nil {
		t.Fatal(err)
	}
	defer acme.Close()
	k := api.BlockKey{Tenant: "acme", Namespace: "n", Key: []byte("pinned")}
	if err := acme.Put(context.Background(), k, randomBytes(8192)); err != nil {
		t.Fatal(err)
	}
	peerTLS := p.clientTLS(t, "node-peer-2")
	xfer := dialKVPT(peerTLS, "")
	if st := read(xfer, 0, 4096); st != 2 {
		t.Errorf("a node reading what it has not pinned: status %d, want 2 (no grant)", st)
	}
	ctx := context.Background()
	pc, err := wire.Dial(ctx, s.addr, wire.ConnConfig{Status: api.FromWireStatus, TLS: peerTLS})
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	pin, err := pc.RoundTrip(ctx, &wire.Request{Op: wire.OpView, Tenant: []byte("acme"), Namespace: []byte("n"), Key: []byte("pinned")})
	if err != nil {
		t.Fatal(err)
	}
	off, size := pin.Offset, pin.ValueLen
	for _, tc := range []struct {
		name           string
		offset, length uint64
		want           int
	}{
		{"the pinned block", off, size, 0},
		{"its second half", off + size/2, size / 2, 0},
		{"one byte past it", off, size + 1, 2},
		{"the bytes before it", off - min(off, 4096), min(off, 4096) + 1, 2},
	} {
		if tc.length == 1 && off == 0 {
			continue
		}
		if st := read(xfer, tc.offset, tc.length); st != tc.want {
			t.Errorf("%s [%d, +%d): status %d, want %d", tc.name, tc.offset, tc.length, st, tc.want)
		}
	}
	if err := pc.Notify(&wire.Request{Op: wire.OpRelease, Handle: pin.Handle}, time.Second); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, "the grant to end with the pin", 5*time.Second, func() bool { return read(xfer, off, size) == 2 })

	// Writes: only into a reservation the node made, while it is open.
	write := func(offset, length uint64) int {
		req := make([]byte, 24)
		req[0] = byte(transfer.Write)
		binary.LittleEndian.PutUint32(req[4:], 1)
		binary.LittleEndian.PutUint64(req[8:], offset)
		binary.LittleEndian.PutUint64(req[16:], length)
		if _, err := xfer.Write(append(req, make([]byte, length)...)); err != nil {
			return -1
		}
		xfer.SetReadDeadline(time.Now().Add(3 * time.Second))
		var resp [16]byte
		if _, err := io.ReadFull(xfer, resp[:]); err != nil {
			return -1
		}
		return int(resp[0])
	}
	res, err := pc.RoundTrip(ctx, &wire.Request{Op: wire.OpReserve, ValueLen: 4096, Tenant: []byte("acme"), Namespace: []byte("n"), Key: []byte("replica")})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name           string
		offset, length uint64
		want           int
	}{
		{"into the reservation", res.Offset, 4096, 0},
		{"past its end", res.Offset + 1, 4096, 2},
		{"into the pinned block's old range", off, 16, 2},
	} {
		if st := write(tc.offset, tc.length); st != tc.want {
			t.Errorf("a write %s [%d, +%d): status %d, want %d", tc.name, tc.offset, tc.length, st, tc.want)
		}
	}
	if err := pc.Notify(&wire.Request{Op: wire.OpAbort, Handle: res.Handle}, time.Second); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, "the write grant to end with the reservation", 5*time.Second, func() bool { return write(res.Offset, 4096) == 2 })
}

// A token removed from the token file, or past its expiry, stops working
// within a second, without a restart.
func TestTokensRevokeAndExpire(t *testing.T) {
	p := makePKI(t, "secure-3")
	short := strings.TrimSpace(mustOK(t, kv(t, nil, "auth", "token", "--name", "short", "--tenant", "acme", "--valid", "3s", "--file", p.tokens)).stdout)
	s := startServe(t, append([]string{"--standalone", "--capacity", "16MiB", "--node-id", "secure-3"}, p.serveArgs("secure-3")...)...)
	exists := func(token string) error {
		cc := caller{tls: p.clientTLS(t, ""), token: token}.grpcConn(t, s.addr)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := kvpoolv1.NewKVPoolServiceClient(cc).Exists(ctx, &kvpoolv1.ExistsRequest{Tenant: "acme", Namespace: "n", Keys: [][]byte{[]byte("k")}})
		return err
	}
	for _, tok := range []string{p.bearer["acme-token"], short} {
		if err := exists(tok); err != nil {
			t.Fatalf("a granted token: %v", err)
		}
	}
	// Revoke acme-token: rewrite the file without its line.
	b, err := os.ReadFile(p.tokens)
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if !strings.HasPrefix(l, "acme-token ") {
			kept = append(kept, l)
		}
	}
	if err := os.WriteFile(p.tokens, []byte(strings.Join(kept, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	eventually.True(t, "the revoked token to stop working", 5*time.Second, func() bool { return outcome(exists(p.bearer["acme-token"])) == "unauth" })
	// The node re-reads the file every TokenReloadInterval (250 ms); the
	// figure is logged, and the wait above bounds it loosely so a loaded
	// machine does not fail the test.
	t.Logf("a revoked token stopped working %v after its line left the file", time.Since(revoked).Round(10*time.Millisecond))
	if err := exists(p.bearer["globex-token"]); outcome(err) != "denied" {
		t.Errorf("globex's token on acme's blocks: %v, want PermissionDenied (the other tokens stay)", err)
	}
	eventually.True(t, "the 3 s token to expire", 10*time.Second, func() bool { return outcome(exists(short)) == "unauth" })
}

// Three daemons secured with mutual TLS on a separate etcd: a tenant puts
// with copies on one node and fetches on another; the nodes pin, read and
// replicate between themselves over TLS with their node certificates, over
// the tcp and the grpc transports. Another tenant's fetch is refused.
func TestSecuredClusterFetchesAndReplicates(t *testing.T) {
	e := startEtcdProcess(t)
	ids := []string{"sec-0", "sec-1", "sec-2"}
	p := makePKI(t, ids...)
	var nodes []*server
	for i, id := range ids {
		tr := []string{"tcp", "grpc", "tcp"}[i]
		args := append([]string{"--node-id", id, "--etcd-endpoints", e.client, "--lease-ttl", "2s", "--capacity", "64MiB", "--transport", tr}, p.serveArgs(id)...)
		nodes = append(nodes, startServe(t, args...))
	}
	dial := func(i int, cert string) *api.Client {
		c, err := api.Dial(context.Background(), api.ClientConfig{Server: nodes[i].addr, Path: api.PathData, TLS: p.clientTLS(t, cert)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	ctx := context.Background()
	acme0, acme1, acme2, globex1 := dial(0, "tenant-acme"), dial(1, "tenant-acme"), dial(2, "tenant-acme"), dial(1, "tenant-globex")
	keys := chainKeys(t, 41, 4)
	values := make([][]byte, len(keys))
	for i, k := range keys {
		values[i] = randomBytes(300_000)
		bk := api.BlockKey{Tenant: "acme", Namespace: "llama3-8b", Key: k}
		var err error
		eventually.True(t, "a put with 2 copies to find a peer", 10*time.Second, func() bool {
			err = acme0.PutReplicas(ctx, bk, values[i], 2)
			return err == nil
		})
	}
	for _, fc := range []struct {
		name string
		c    *api.Client
	}{{"sec-1 (pulls over grpc)", acme1}, {"sec-2 (pulls over tcp)", acme2}} {
		eventually.True(t, fc.name+" to fetch acme's chain", 10*time.Second, func() bool {
			res, err := fc.c.Fetch(ctx, "acme", "llama3-8b", keys, time.Second)
			if err != nil {
				return false
			}
			for _, r := range res {
				if r.Err != nil {
					return false
				}
			}
			return true
		})
		for i, k := range keys {
			got, err := fc.c.GetValue(ctx, api.BlockKey{Tenant: "acme", Namespace: "llama3-8b", Key: k})
			if err != nil || string(got) != string(values[i]) {
				t.Fatalf("%s: block %d after the fetch: %v", fc.name, i, err)
			}
		}
	}
	if _, err := globex1.Fetch(ctx, "acme", "llama3-8b", keys, time.Second); !errors.Is(err, api.ErrPermissionDenied) {
		t.Errorf("globex fetching acme's chain: %v, want PermissionDenied", err)
	}
	// sec-2 now knows the namespace's block size: it reads the next
	// chain's blocks by name, over TLS, the holder checking its node
	// certificate's right to read acme's blocks.
	more := chainKeys(t, 43, 2)
	for i, k := range more {
		if err := acme0.Put(ctx, api.BlockKey{Tenant: "acme", Namespace: "llama3-8b", Key: k}, values[i]); err != nil {
			t.Fatal(err)
		}
	}
	eventually.True(t, "sec-2 to fetch the second chain", 10*time.Second, func() bool {
		res, err := acme2.Fetch(ctx, "acme", "llama3-8b", more, time.Second)
		return err == nil && res[0].Err == nil && res[1].Err == nil
	})
	for i, k := range more {
		got, err := acme2.GetValue(ctx, api.BlockKey{Tenant: "acme", Namespace: "llama3-8b", Key: k})
		if err != nil || string(got) != string(values[i]) {
			t.Fatalf("sec-2: block %d of the second chain: %v", i, err)
		}
	}
	if n, ok := metricValue(nodes[2].metrics, `kvpool_transfer_fetched_blocks_total{addressed="name"}`); !ok || n < 2 {
		t.Fatalf("sec-2 read %v blocks by name (found: %v), want the second chain's 2", n, ok)
	}
}

// Daemons reach an etcd that requires TLS client certificates (Debian's
// etcd as a process) with --etcd-ca, --etcd-cert and --etcd-key: they
// register and see each other's blocks.
func TestEtcdWithTLS(t *testing.T) {
	p := makePKI(t, "etcd", "tls-a", "tls-b")
	e := startEtcdProcessWith(t, "https", []string{"--cert-file", p.file("node-etcd.pem"), "--key-file", p.file("node-etcd-key.pem"),
		"--trusted-ca-file", p.file("ca.pem"), "--client-cert-auth"}, p.clientTLS(t, "admin-ops"))
	var nodes []*server
	for _, id := range []string{"tls-a", "tls-b"} {
		nodes = append(nodes, startServe(t, append([]string{"--node-id", id, "--etcd-endpoints", e.client, "--lease-ttl", "2s", "--capacity", "16MiB",
			"--etcd-ca", p.file("ca.pem"), "--etcd-cert", p.file("node-" + id + ".pem"), "--etcd-key", p.file("node-" + id + "-key.pem")}, p.serveArgs(id)...)...))
	}
	c, err := api.Dial(context.Background(), api.ClientConfig{Server: nodes[0].addr, Path: api.PathData, TLS: p.clientTLS(t, "tenant-acme")})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	keys := chainKeys(t, 51, 2)
	putChain(t, c, keys)
	b, err := api.Dial(context.Background(), api.ClientConfig{Server: nodes[1].addr, Path: api.PathData, TLS: p.clientTLS(t, "tenant-acme")})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	eventually.True(t, "tls-b to see tls-a's blocks through the TLS etcd", 10*time.Second, func() bool {
		hs, err := b.Route(context.Background(), "acme", "llama3-8b", keys)
		return err == nil && len(hs) == 2 && len(hs[1]) > 0 && hs[1][0].NodeID == "tls-a"
	})
	if e.epoch("tls-a") == 0 || e.epoch("tls-b") == 0 {
		t.Fatal("the daemons are not registered in the TLS etcd")
	}
}

// Beyond loopback, serve refuses to run open: exit 2 and what to do about
// it; with --insecure it starts, and warns in one line.
func TestServeRefusesToRunOpenBeyondLoopback(t *testing.T) {
	dir := t.TempDir()
	base := []string{"node", "serve", "--standalone", "--capacity", "16MiB", "--listen", "0.0.0.0:0", "--metrics-listen", "",
		"--shm-socket", filepath.Join(dir, "s.sock"), "--log-format", "json"}
	r := kv(t, nil, base...)
	if r.code != 2 || !strings.Contains(r.stderr, "beyond loopback, needs TLS") || !strings.Contains(r.stderr, "--insecure") {
		t.Fatalf("open on 0.0.0.0: exit %d, stderr %q; want 2 and how to fix it", r.code, r.stderr)
	}
	cmd := exec.Command(kvpoolBin(t), append(base, "--insecure", "--node-id", "insecure-1")...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() }()
	warned := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var rec map[string]any
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["level"] == "WARN" && strings.Contains(fmt.Sprint(rec["msg"]), "running open to the network") {
				warned <- sc.Text()
			}
		}
	}()
	select {
	case line := <-warned:
		t.Logf("with --insecure: %s", line)
	case <-time.After(30 * time.Second):
		t.Fatal("serve --insecure did not warn that it runs open within 30 s")
	}
}

// securedClusterTests are the tests on in-process clusters (cluster.New),
// run again by TestClusterTestsWithMutualTLS with every node secured.
var securedClusterTests = []string{
	"TestClusterLocality", "TestReportLoadReachesEveryDaemon", "TestExternalEtcdProcess", "TestThreeMemberEtcdLosesAMember",
	"TestDaemonCrash", "TestEtcdOutage", "TestCompactionWhileDisconnected", "TestRestartWithSameID", "TestMalformedRecords",
	"TestRestartOnNewGossipPort", "TestFetchPullsFromTheHolderAndPublishesAReplica", "TestFetchCorruptionRetriesAnotherReplica",
	"TestFetchFromADeadOrStalledHolder", "TestPutWithReplicas", "TestGetDirectReadsFromTheHolders", "TestPlanMatchesExecution",
	"TestPlanRPCValidation", "TestLivePolicyChangeReachesEveryDaemon",
}

// The cluster tests pass with mutual TLS everywhere: every node with a
// node certificate, every client and CLI call with an admin's, transfers
// between nodes under their grants, and etcd serving TLS and requiring a
// client certificate of every daemon. The test binary runs them again
// with KVPOOL_SECURE_CLUSTER=1.
func TestClusterTestsWithMutualTLS(t *testing.T) {
	if os.Getenv("KVPOOL_SECURE_CLUSTER") != "" {
		t.Skip("already secured")
	}
	if testing.Short() {
		t.Skip("the cluster tests are skipped under -short")
	}
	listed, err := exec.Command(os.Args[0], "-test.list", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range securedClusterTests {
		if !slices.Contains(strings.Fields(string(listed)), name) {
			t.Fatalf("%s is not a test any more: update securedClusterTests", name)
		}
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^("+strings.Join(securedClusterTests, "|")+")$", "-test.count", "1")
	cmd.Env = append(os.Environ(), "KVPOOL_SECURE_CLUSTER=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the cluster tests with mutual TLS: %v\n%s", err, out)
	}
	t.Logf("%d cluster tests passed with mutual TLS everywhere", len(securedClusterTests))
}

// --data-encryption decides which bulk connections between nodes run
// through TLS: always; never (plaintext, nodes known by their peer
// tokens); cross-zone (plaintext inside a zone, TLS across zones). The
// nodes' own counters of what connected say which.
func TestDataEncryptionPerLinkClass(t *testing.T) {
	for _, tc := range []struct {
		mode  string
		zones []string
		// want is, per fetch (node 1 from node 0, then node 2 from node 0),
		// whether its transfer connections were TLS.
		want [2]bool
	}{
		{"always", []string{"a", "a", "b"}, [2]bool{true, true}},
		{"never", []string{"a", "a", "b"}, [2]bool{false, false}},
		{"cross-zone", []string{"a", "a", "b"}, [2]bool{false, true}},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			dir := t.TempDir()
			var lines []string
			peerFiles := make([]string, 3)
			for i := range 3 {
				id := fmt.Sprintf("node-%d", i)
				tok, line, err := auth.NewToken("peer-"+id, auth.Identity{Role: auth.RoleNode, Name: id}, time.Time{})
				if err != nil {
					t.Fatal(err)
				}
				lines = append(lines, line)
				peerFiles[i] = filepath.Join(dir, id+".token")
				if err := os.WriteFile(peerFiles[i], []byte(tok), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			tokens := filepath.Join(dir, "tokens")
			if err := os.WriteFile(tokens, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			regs := make([]*prometheus.Registry, 3)
			c := cluster.New(t, cluster.Config{Nodes: 3, Secure: true, Mutate: func(i int, pc *pool.Config) {
				regs[i] = prometheus.NewRegistry()
				pc.Registerer, pc.Gatherer = regs[i], regs[i]
				pc.Zone, pc.DataEncryption = tc.zones[i], tc.mode
				pc.TokenFile, pc.PeerTokenFile = tokens, peerFiles[i]
			}})
			keys := chainKeys(t, 61, 2)
			putChain(t, c.Client(0, api.PathData), keys)
			c.Converged(10 * time.Second)
			// transfers sums, over the three nodes (a fetch may pull from
			// node-0 or from a replica a fetch before placed), the transfer
			// connections that arrived with security.
			transfers := func(security string) float64 {
				sum := 0.0
				for _, reg := range regs {
					sum += counters(t, reg, "kvpool_pool_accepted_connections_total", func(labels map[string]string) string {
						if labels["protocol"] == "transfer" {
							return labels["security"]
						}
						return ""
					})[security]
				}
				return sum
			}
			for i, fetcher := range []int{1, 2} {
				tlsBefore, plainBefore := transfers("tls"), transfers("plaintext")
				res, err := c.Client(fetcher, api.PathData).Fetch(context.Background(), "acme", "llama3-8b", keys, time.Second)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range res {
					if r.Err != nil {
						t.Fatalf("node-%d fetching: %v", fetcher, r.Err)
					}
				}
				gotTLS, gotPlain := transfers("tls")-tlsBefore, transfers("plaintext")-plainBefore
				if (gotTLS > 0) != tc.want[i] || (gotPlain > 0) == tc.want[i] {
					t.Errorf("node-%d (zone %s) fetching from a holder in zone a: %v TLS and %v plaintext transfer connections; want TLS %v",
						fetcher, tc.zones[fetcher], gotTLS, gotPlain, tc.want[i])
				}
			}
		})
	}
}

// runShmUIDHelper runs as another user (TestShmAllowBindsATenantToAUID):
// it reaches the node over shared memory (its gRPC calls carry
// KVPOOL_HELPER_TOKEN) and puts a block of tenant acme and one of globex,
// printing the gRPC code of each.
func runShmUIDHelper() int {
	ctx := context.Background()
	c, err := api.Dial(ctx, api.ClientConfig{Server: os.Getenv("KVPOOL_HELPER_ADDR"), Path: api.PathShm, Token: os.Getenv("KVPOOL_HELPER_TOKEN")})
	if err != nil {
		fmt.Printf("dial=%v\n", api.Code(err))
		return 0
	}
	defer c.Close()
	var out []string
	for _, tenant := range []string{"acme", "globex"} {
		err := c.Put(ctx, api.BlockKey{Tenant: tenant, Namespace: "shm", Key: []byte(fmt.Sprintf("uid-%d", os.Getuid()))}, []byte("v"))
		out = append(out, fmt.Sprintf("%s=%v", tenant, api.Code(err)))
	}
	fmt.Println(strings.Join(out, " "))
	return 0
}

// Other users reach a secured node's shared memory only when --shm-allow
// names them, and a UID=TENANT entry binds their sessions to that tenant:
// the node's checks run as processes of other uids (the test runs as
// root, which may start them).
func TestShmAllowBindsATenantToAUID(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root, to run helpers as other users")
	}
	p := makePKI(t, "shm-secure")
	sock := fmt.Sprintf("/tmp/kvpool-shmallow-%d.sock", os.Getpid())
	s := startServe(t, append([]string{"--standalone", "--capacity", "16MiB", "--node-id", "shm-secure", "--shm-socket", sock,
		"--shm-allow", "61001=acme", "--shm-allow", "61002"}, p.serveArgs("shm-secure")...)...)
	// The test binary may sit in a directory other users cannot enter.
	bin := fmt.Sprintf("/tmp/kvpool-shm-helper-%d", os.Getpid())
	src, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, src, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(bin)
	run := func(uid uint32) string {
		cmd := exec.Command(bin, "-test.run=^$")
		cmd.Env = append(os.Environ(), "KVPOOL_TEST_HELPER=shm-uid", "KVPOOL_HELPER_ADDR="+s.addr, "KVPOOL_HELPER_TOKEN="+p.bearer["acme-token"])
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		cmd.Dir = "/"
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("helper as uid %d: %v\n%s", uid, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	for _, tc := range []struct {
		uid  uint32
		want string
	}{
		{61001, "acme=OK globex=PermissionDenied"}, // bound to acme
		{61002, "acme=OK globex=OK"},               // allowed, unbound: trusted
		{61003, "acme=PermissionDenied"},           // not allowed: refused, and the session ends
	} {
		if got := run(tc.uid); !strings.HasPrefix(got, tc.want) {
			t.Errorf("uid %d: %s, want %s", tc.uid, got, tc.want)
		}
	}
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o666 {
		t.Errorf("the shm socket with --shm-allow: %v %v, want mode 0666", fi.Mode().Perm(), err)
	}
}

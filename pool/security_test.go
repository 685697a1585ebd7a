package pool

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/auth"
	"github.com/kvpool/kvpool/api/wire"
	"github.com/kvpool/kvpool/internal/eventually"
	"github.com/kvpool/kvpool/transfer"
)

// Every gRPC method a node serves has a row in the access table: a new
// RPC cannot be added without saying who may call it.
func TestEveryMethodHasARule(t *testing.T) {
	n := startNode(t)
	served := 0
	for svc, info := range n.grpcSrv.GetServiceInfo() {
		for _, m := range info.Methods {
			served++
			if _, ok := grpcRules["/"+svc+"/"+m.Name]; !ok {
				t.Errorf("/%s/%s has no row in grpcRules (pool/access.go)", svc, m.Name)
			}
		}
	}
	if served < 30 {
		t.Fatalf("the node serves only %d methods: the listing is wrong", served)
	}
}

func TestSecurityConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		name   string
		listen string
		sec    SecurityConfig
		want   []string // substrings of the error; nil: valid
	}{
		{"open on loopback", "127.0.0.1:7070", SecurityConfig{}, nil},
		{"open on localhost", "localhost:7070", SecurityConfig{}, nil},
		{"open on ::1", "[::1]:7070", SecurityConfig{}, nil},
		{"open beyond loopback", "0.0.0.0:7070", SecurityConfig{}, []string{"beyond loopback, needs TLS"}},
		{"open beyond loopback, insecure", "0.0.0.0:7070", SecurityConfig{Insecure: true}, nil},
		{"TLS without credentials beyond loopback", "10.0.0.1:7070", SecurityConfig{TLSCertFile: "c", TLSKeyFile: "k"}, []string{"needs TLS"}},
		{"TLS and tokens beyond loopback", "10.0.0.1:7070", SecurityConfig{TLSCertFile: "c", TLSKeyFile: "k", TokenFile: "t"}, nil},
		{"tokens without TLS beyond loopback", "10.0.0.1:7070", SecurityConfig{TokenFile: "t"}, []string{"needs TLS"}},
		{"a certificate without its key", "127.0.0.1:7070", SecurityConfig{TLSCertFile: "c"}, []string{"give both or neither"}},
		{"a client CA without TLS", "127.0.0.1:7070", SecurityConfig{ClientCAFile: "ca"}, []string{"need the node's own TLS certificate"}},
		{"a bad trust domain", "127.0.0.1:7070", SecurityConfig{TrustDomain: "a/b"}, []string{"trust domain"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.sec.fill()
			errs := tc.sec.validate(tc.listen)
			if len(errs) != len(tc.want) {
				t.Fatalf("problems %v, want %d matching %q", errs, len(tc.want), tc.want)
			}
			for i, e := range errs {
				if !strings.Contains(e.Error(), tc.want[i]) {
					t.Errorf("problem %q, want it to contain %q", e, tc.want[i])
				}
			}
		})
	}
}

// securedConfig secures cfg with a CA, a node certificate and a token file
// made in dir; it returns a tenant token.
func securedConfig(t testing.TB, cfg *Config, dir string) string {
	t.Helper()
	ca, err := auth.LoadOrMakeCA(dir, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.Issue(dir, "node", auth.Identity{Role: auth.RoleNode, Name: cfg.NodeID}, auth.DefaultTrustDomain, []string{"127.0.0.1"}, true, time.Hour); err != nil {
		t.Fatal(err)
	}
	tok, line, err := auth.NewToken("t", auth.Identity{Role: auth.RoleTenant, Tenant: "t"}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokens"), []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.TLSCertFile, cfg.TLSKeyFile = filepath.Join(dir, "node.pem"), filepath.Join(dir, "node-key.pem")
	cfg.ClientCAFile, cfg.TokenFile = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "tokens")
	return tok
}

// FuzzDoors sends arbitrary first bytes to a secured node's TCP port (the
// sniffer, the preambles and their tokens, the TLS handshake, gRPC's
// preface): nothing panics, nothing is left reserved, and the node still
// answers an authenticated client.
func FuzzDoors(f *testing.F) {
	f.Add(wire.AppendPreamble(nil, wire.Preamble, "kvp_x"))
	f.Add(wire.AppendPreamble(nil, transfer.TCPPreamble, "kvp_x"))
	f.Add(append(wire.AppendPreamble(nil, wire.Preamble, ""), wire.AppendRequest(nil, &wire.Request{Op: wire.OpReserve, ValueLen: 8, Tenant: []byte("t"), Namespace: []byte("n"), Key: []byte("k")})...))
	f.Add([]byte{0x16, 0x03, 0x01, 0x00, 0x05, 0x01, 0x00, 0x00, 0x01, 0x00})
	f.Add([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
	var token string
	n := startNode(f, func(c *Config) {
		c.HandshakeTimeout = 50 * time.Millisecond
		token = securedConfig(f, c, f.TempDir())
	})
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := net.Dial("tcp", n.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.Write(in)
		c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		io.Copy(io.Discard, c)
		c.Close()
	})
	c, err := api.Dial(context.Background(), api.ClientConfig{Server: n.Addr().String(), Path: api.PathData, Token: token})
	if err != nil {
		f.Fatal(err)
	}
	defer c.Close()
	if err := c.Put(context.Background(), api.BlockKey{Tenant: "t", Namespace: "n", Key: []byte("after")}, []byte("v")); err != nil {
		f.Fatalf("after the fuzz: %v", err)
	}
	eventually.True(f, "no reservation left", 5*time.Second, func() bool { return n.Store().Stats().Reservations == 0 })
}

func TestGrants(t *testing.T) {
	var g grants
	g.add("n1", grant{offset: 4096, length: 8192})
	g.add("n1", grant{offset: 4096, length: 8192}) // held twice
	g.add("n2", grant{offset: 0, length: 4096, write: true})
	for _, tc := range []struct {
		node           string
		write          bool
		offset, length uint64
		want           bool
	}{
		{"n1", false, 4096, 8192, true},
		{"n1", false, 8192, 4096, true},
		{"n1", false, 4095, 2, false},
		{"n1", false, 4096, 8193, false},
		{"n1", false, 12288, 1, false},
		{"n1", false, 1<<64 - 1, 2, false}, // no wrap-around
		{"n1", true, 4096, 1, false},       // a read grant does not write
		{"n2", true, 0, 4096, true},
		{"n2", false, 0, 1, false},
		{"n3", false, 4096, 1, false},
	} {
		if got := g.allows(tc.node, tc.write, tc.offset, tc.length); got != tc.want {
			t.Errorf("%s write=%v [%d, +%d): %v, want %v", tc.node, tc.write, tc.offset, tc.length, got, tc.want)
		}
	}
	g.remove("n1", grant{offset: 4096, length: 8192})
	if !g.allows("n1", false, 4096, 1) {
		t.Error("one hold of two removed: the grant must stay")
	}
	g.remove("n1", grant{offset: 4096, length: 8192})
	g.remove("n2", grant{offset: 0, length: 4096, write: true})
	if g.held() != 0 || g.allows("n1", false, 4096, 1) {
		t.Errorf("%d grants left after every hold was removed", g.held())
	}
}

// A write grant ends with its reservation, also when the node reclaims it:
// its pages may hold another block by then.
func TestWriteGrantsEndWithTheirReservation(t *testing.T) {
	open := map[uint64]bool{7: true}
	g := grants{open: func(h uint64) bool { return open[h] }}
	gr := grant{offset: 0, length: 4096, write: true, reservation: 7}
	g.add("n1", gr)
	if !g.allows("n1", true, 0, 4096) {
		t.Fatal("a write into an open reservation is refused")
	}
	open[7] = false // reclaimed past the reservation timeout
	if g.allows("n1", true, 0, 4096) {
		t.Fatal("a write into a reclaimed reservation is allowed")
	}
}

// The store says a reservation is open until it is committed, aborted or
// reclaimed.
func TestReservationOpen(t *testing.T) {
	n := startNode(t, func(c *Config) { c.ReservationTimeout = time.Hour })
	st := n.Store()
	r, err := st.Reserve([]byte("t"), []byte("n"), []byte("k"), 100, false)
	if err != nil {
		t.Fatal(err)
	}
	if !st.ReservationOpen(r.Handle()) {
		t.Fatal("a new reservation is not open")
	}
	if st.ReclaimExpired(time.Now().Add(2*time.Hour)) != 1 || st.ReservationOpen(r.Handle()) {
		t.Fatal("a reclaimed reservation is still open")
	}
}

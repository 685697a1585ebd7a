package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kvpool/kvpool/api"
)

// The access table: every role × every operation, on its own tenant's
// blocks and on another's. "ok", "denied" (PermissionDenied) or
// "unauthenticated".
func TestAuthorize(t *testing.T) {
	acme := Identity{Role: RoleTenant, Tenant: "acme", Name: "engine-1"}
	node := Identity{Role: RoleNode, Name: "node-2"}
	admin := Identity{Role: RoleAdmin, Name: "ops"}
	anon := Identity{}
	want := map[Identity]map[Op][2]string{ // [on acme's blocks, on globex's]
		acme: {
			OpInfo: {"ok", "ok"}, OpRead: {"ok", "denied"}, OpWrite: {"ok", "denied"}, OpPlan: {"ok", "denied"},
			OpStats: {"ok", "ok"}, OpReportLoad: {"ok", "ok"}, OpTransfer: {"denied", "denied"},
			OpAdminRead: {"denied", "denied"}, OpAdminWrite: {"denied", "denied"},
		},
		node: {
			OpInfo: {"ok", "ok"}, OpRead: {"ok", "ok"}, OpWrite: {"ok", "ok"}, OpPlan: {"ok", "ok"},
			OpStats: {"denied", "denied"}, OpReportLoad: {"denied", "denied"}, OpTransfer: {"ok", "ok"},
			OpAdminRead: {"denied", "denied"}, OpAdminWrite: {"denied", "denied"},
		},
		admin: {},
		anon:  {},
	}
	for _, op := range Ops() {
		want[admin][op] = [2]string{"ok", "ok"}
		if op == OpTransfer {
			want[admin][op] = [2]string{"denied", "denied"}
		}
		want[anon][op] = [2]string{"unauthenticated", "unauthenticated"}
	}
	outcome := func(err error) string {
		switch {
		case err == nil:
			return "ok"
		case errors.Is(err, api.ErrPermissionDenied):
			return "denied"
		case errors.Is(err, api.ErrUnauthenticated):
			return "unauthenticated"
		}
		return err.Error()
	}
	for id, ops := range want {
		if len(ops) != len(Ops()) {
			t.Fatalf("%v: the table lists %d of %d operations", id, len(ops), len(Ops()))
		}
		for op, w := range ops {
			for i, tenant := range []string{"acme", "globex"} {
				if got := outcome(Authorize(id, op, tenant, false)); got != w[i] {
					t.Errorf("%v %v on %s's blocks: %s, want %s", id, op, tenant, got, w[i])
				}
				if err := Authorize(id, op, tenant, true); err != nil {
					t.Errorf("%v %v on an open node: %v", id, op, err)
				}
			}
		}
	}
}

func TestTokens(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	acmeTok, acmeLine, err := NewToken("engine-1", Identity{Role: RoleTenant, Tenant: "acme"}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	nodeTok, nodeLine, _ := NewToken("peer", Identity{Role: RoleNode, Name: "node-2"}, now.Add(time.Hour))
	adminTok, adminLine, _ := NewToken("ops", Identity{Role: RoleAdmin}, time.Time{})
	if !strings.HasPrefix(acmeTok, TokenPrefix) || len(acmeTok) != len(TokenPrefix)+43 {
		t.Fatalf("token %q", acmeTok)
	}
	if strings.Contains(acmeLine, acmeTok[len(TokenPrefix):]) {
		t.Fatal("the file line holds the token itself")
	}
	file := "# tokens\n\n" + acmeLine + "\n  " + nodeLine + "\n" + adminLine + "\n"
	toks, err := ParseTokens(strings.NewReader(file))
	if err != nil {
		t.Fatal(err)
	}
	if toks.Len() != 3 {
		t.Fatalf("%d tokens", toks.Len())
	}
	for _, tc := range []struct {
		bearer string
		at     time.Time
		want   Identity
		err    error
	}{
		{acmeTok, now, Identity{Role: RoleTenant, Tenant: "acme", Name: "engine-1"}, nil},
		{nodeTok, now, Identity{Role: RoleNode, Name: "node-2"}, nil},
		{nodeTok, now.Add(time.Hour), Identity{}, api.ErrUnauthenticated}, // expired at its time
		{adminTok, now.Add(1000 * time.Hour), Identity{Role: RoleAdmin, Name: "ops"}, nil},
		{acmeTok + "x", now, Identity{}, api.ErrUnauthenticated},
		{"", now, Identity{}, api.ErrUnauthenticated},
	} {
		got, err := toks.Verify(tc.bearer, tc.at)
		if !errors.Is(err, tc.err) || got != tc.want {
			t.Errorf("Verify(%.12s…, %v) = %v, %v; want %v, %v", tc.bearer, tc.at, got, err, tc.want, tc.err)
		}
	}
}

func TestParseTokensReportsEveryProblem(t *testing.T) {
	good := "a tenant:acme sha256:" + strings.Repeat("ab", 32)
	file := strings.Join([]string{
		good,
		"b tenant:acme", // 2: too few fields
		"c root sha256:" + strings.Repeat("cd", 32), // 3: bad identity
		"d admin md5:00",                                           // 4: bad hash kind
		"e admin sha256:abc",                                       // 5: short hash
		"a admin sha256:" + strings.Repeat("ef", 32),               // 6: duplicate name
		"f admin sha256:" + strings.Repeat("ab", 32),               // 7: duplicate hash
		"g admin sha256:" + strings.Repeat("01", 32) + " tomorrow", // 8: bad expiry
		"h/x admin sha256:" + strings.Repeat("02", 32),             // 9: bad name
	}, "\n")
	_, err := ParseTokens(strings.NewReader(file))
	if !errors.Is(err, api.ErrInvalidArgument) {
		t.Fatalf("err %v", err)
	}
	for n := 2; n <= 9; n++ {
		if !strings.Contains(err.Error(), "line "+string(rune('0'+n))+":") {
			t.Errorf("line %d's problem is not reported: %v", n, err)
		}
	}
	if strings.Contains(err.Error(), "line 1:") {
		t.Errorf("line 1 is fine: %v", err)
	}
}

func FuzzParseTokens(f *testing.F) {
	f.Add("a tenant:acme sha256:" + strings.Repeat("ab", 32) + " 2027-01-01T00:00:00Z\n")
	f.Add("# c\n\nb node:n-1 sha256:" + strings.Repeat("00", 32))
	f.Fuzz(func(t *testing.T, s string) {
		toks, err := ParseTokens(strings.NewReader(s))
		if err != nil {
			return
		}
		for _, tok := range toks.byHash {
			if tok.id.Role == RoleAnonymous || (tok.id.Role == RoleTenant) != (tok.id.Tenant != "") || tok.id.Name == "" {
				t.Fatalf("parsed an invalid identity %+v from %q", tok.id, s)
			}
		}
	})
}

func certWith(t *testing.T, cn string, uris ...string) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	for _, u := range uris {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, pu)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestFromCertificate(t *testing.T) {
	for _, tc := range []struct {
		cn   string
		uris []string
		want Identity
		err  bool
	}{
		{"", []string{"spiffe://kvpool/tenant/acme"}, Identity{Role: RoleTenant, Tenant: "acme", Name: "cert:acme"}, false},
		{"", []string{"https://example.com/x", "spiffe://kvpool/node/gpu-1"}, Identity{Role: RoleNode, Name: "gpu-1"}, false},
		{"tenant:globex", []string{"spiffe://kvpool/admin/ops"}, Identity{Role: RoleAdmin, Name: "ops"}, false}, // the URI wins
		{"node:gpu-2", nil, Identity{Role: RoleNode, Name: "gpu-2"}, false},
		{"admin:root", nil, Identity{Role: RoleAdmin, Name: "root"}, false},
		{"", []string{"spiffe://other/tenant/acme"}, Identity{}, true}, // another trust domain
		{"", []string{"spiffe://kvpool/tenant"}, Identity{}, true},
		{"", []string{"spiffe://kvpool/root/x"}, Identity{}, true},
		{"", []string{"spiffe://kvpool/tenant/a%2Fb"}, Identity{}, true},
		{"www.example.com", nil, Identity{}, true},
	} {
		got, err := FromCertificate(certWith(t, tc.cn, tc.uris...), DefaultTrustDomain)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("CN %q URIs %v: %+v, %v; want %+v (error %v)", tc.cn, tc.uris, got, err, tc.want, tc.err)
		}
		if err != nil && !errors.Is(err, api.ErrUnauthenticated) {
			t.Errorf("CN %q: %v does not wrap ErrUnauthenticated", tc.cn, err)
		}
	}
	id := Identity{Role: RoleTenant, Tenant: "acme"}
	if u := URI(id, "prod"); u.String() != "spiffe://prod/tenant/acme" {
		t.Errorf("URI %s", u)
	}
}

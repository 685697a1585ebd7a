package pool

import (
	"strings"
	"testing"
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

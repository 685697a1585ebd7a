package deptest

import "testing"

func TestMatch(t *testing.T) {
	for _, c := range []struct {
		pattern, path string
		want          bool
	}{
		{"github.com/kvpool/kvpool/pool", "github.com/kvpool/kvpool/pool", true},
		{"github.com/kvpool/kvpool/pool", "github.com/kvpool/kvpool/pool/bench", false},
		{"github.com/kvpool/kvpool/pool/...", "github.com/kvpool/kvpool/pool", true},
		{"github.com/kvpool/kvpool/pool/...", "github.com/kvpool/kvpool/pool/bench", true},
		{"github.com/kvpool/kvpool/pool/...", "github.com/kvpool/kvpool/poolside", false},
		{"go.etcd.io/etcd/server/v3/...", "go.etcd.io/etcd/client/v3", false},
	} {
		if got := Match(c.pattern, c.path); got != c.want {
			t.Errorf("Match(%q, %q) = %v, want %v", c.pattern, c.path, got, c.want)
		}
	}
}

func TestDeps(t *testing.T) {
	Check(t, Rules{OnlyModules: []string{"github.com/kvpool/kvpool/internal/deptest"}})
}

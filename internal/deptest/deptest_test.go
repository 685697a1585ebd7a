package deptest

import (
	"os/exec"
	"strings"
	"testing"
)

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

func TestViolations(t *testing.T) {
	r := Rules{Forbidden: own("pool/..."), OnlyModules: []string{Module + "/...", "golang.org/x/sys/..."}}
	for _, c := range []struct {
		dep  string
		want int
	}{
		{Module + "/api", 0},
		{"golang.org/x/sys/unix", 0},
		{Module + "/pool/store", 1},
		{"go.etcd.io/etcd/client/v3", 1},
	} {
		if got := r.Violations("x", c.dep); len(got) != c.want {
			t.Errorf("Violations(%q) = %q, want %d", c.dep, got, c.want)
		}
	}
	if got := (Rules{OnlyModules: []string{}}).Violations("x", "golang.org/x/sys/unix"); len(got) != 1 {
		t.Errorf("an empty OnlyModules allowed golang.org/x/sys/unix: %q", got)
	}
}

// TestGraph checks every package of the module against its row of Graph:
// every dependency, direct or transitive, of its non-test code. A package
// without a row fails, and so does a row naming no package.
func TestGraph(t *testing.T) {
	out, err := exec.Command(GoTool(), "list", "-f", "{{.ImportPath}}{{range .Deps}} {{.}}{{end}}", Module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := fields[0]
		rel := strings.TrimPrefix(pkg, Module+"/")
		r, ok := Graph[rel]
		if !ok {
			t.Errorf("%s has no row in deptest.Graph (internal/deptest/graph.go): add one saying what it may not import", pkg)
			continue
		}
		seen[rel] = true
		for _, dep := range fields[1:] {
			if !Standard(dep) {
				for _, v := range r.Violations(pkg, dep) {
					t.Error(v)
				}
			}
		}
	}
	for rel := range Graph {
		if !seen[rel] {
			t.Errorf("deptest.Graph has a row for %s, which is not a package of the module", rel)
		}
	}
}

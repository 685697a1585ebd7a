package cost

import (
	"testing"

	"github.com/kvpool/kvpool/internal/deptest"
)

// TestDeps keeps the cost model pure and small: the standard library and
// a YAML decoder for profile documents, nothing of kvpool's.
func TestDeps(t *testing.T) {
	deptest.Check(t, deptest.Rules{OnlyModules: []string{"sigs.k8s.io/yaml/...", "go.yaml.in/yaml/..."}})
}

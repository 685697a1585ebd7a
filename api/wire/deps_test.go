package wire

import (
	"testing"

	"github.com/kvpool/kvpool/internal/deptest"
)

// TestDeps: the protocol is the standard library alone, so the client and
// the node share it without sharing anything else.
func TestDeps(t *testing.T) {
	deptest.Check(t, deptest.Rules{OnlyModules: []string{}})
}

package crc32c

import (
	"testing"

	"github.com/kvpool/kvpool/internal/deptest"
)

// TestDeps: the checksum needs the standard library and x/sys/cpu alone.
func TestDeps(t *testing.T) {
	deptest.Check(t, deptest.Rules{OnlyModules: []string{"golang.org/x/sys/cpu"}})
}

package eventually

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvpool/kvpool/internal/deptest"
)

func TestWithin(t *testing.T) {
	var n atomic.Int32
	if !Within(time.Second, func() bool { return n.Add(1) == 5 }) {
		t.Fatal("a condition that turns true after 5 checks was not seen")
	}
	start := time.Now()
	if Within(20*time.Millisecond, func() bool { return false }) {
		t.Fatal("a condition that never holds was reported as holding")
	}
	if el := time.Since(start); el < 20*time.Millisecond {
		t.Fatalf("gave up after %v, before the 20ms deadline", el)
	}
}

func TestDeps(t *testing.T) {
	deptest.Check(t, deptest.Rules{OnlyModules: []string{"github.com/kvpool/kvpool/internal/eventually", "github.com/kvpool/kvpool/internal/deptest"}})
}

package replay

import (
	"context"
	"strings"
	"testing"
)

// A replay without daemons, requests or an engine is refused with every
// problem named, before anything starts.
func TestConfigReportsEveryProblem(t *testing.T) {
	_, err := Run(context.Background(), Config{})
	if err == nil {
		t.Fatal("ran an empty replay")
	}
	for _, want := range []string{"no daemons", "no requests", "engine", "link", "model, tenant and namespace"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error lacks %q: %v", want, err)
		}
	}
}

func TestKeysAreDistinctPerBlock(t *testing.T) {
	if string(key(1)) == string(key(2)) || len(key(1<<63)) != 11 {
		t.Fatalf("keys %x %x %x", key(1), key(2), key(1<<63))
	}
}

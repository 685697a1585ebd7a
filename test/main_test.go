package test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain removes the binary the end-to-end tests built, and checks that
// no goroutine outlives the clusters and daemons the tests started.
func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: goroutines outlived the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

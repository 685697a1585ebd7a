// Package eventually waits in tests for a condition to hold, instead of
// sleeping for a guessed time: every test in the module that waits for
// something asynchronous (a mirror catching up, a connection closing, a
// lease expiring) waits through True.
package eventually

import (
	"testing"
	"time"
)

// Poll is how often True checks its condition.
const Poll = 2 * time.Millisecond

// True checks cond until it returns true, and fails the test (Fatalf) when
// within passes first, naming what it waited for. cond runs on the test's
// goroutine.
func True(t testing.TB, what string, within time.Duration, cond func() bool) {
	t.Helper()
	if !Within(within, cond) {
		t.Fatalf("timed out after %v waiting for %s", within, what)
	}
}

// Within checks cond until it returns true or within passes, and reports
// whether it held: for callers that fail in their own words, or that must
// not call Fatal off the test goroutine.
func Within(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(Poll)
	}
	return true
}

//go:build !amd64 && !arm64

package seqlock

// Fenced is false: this package has no load fence for this architecture,
// and callers must verify what Copy copied.
const Fenced = false

func loadFence() {}

package seqlock

// Fenced: loadFence orders loads on this architecture.
const Fenced = true

// loadFence keeps every load before it from completing after any load
// after it (DMB ISHLD).
func loadFence()

package seqlock

// Fenced: loadFence orders loads on this architecture.
const Fenced = true

// loadFence: amd64 never reorders a load with a later load, so the fence
// is only a call that the compiler cannot move loads across.
func loadFence()

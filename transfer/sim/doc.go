// Package sim is kvpool's discrete-event simulator of a serving cluster:
// engines with GPU prefix caches and kvpool host tiers, requests from a
// production trace routed by a policy, prefill from the cost model's
// curves, decode with continuous batching, and fetches over shared links.
// It answers the routing question for a whole workload, using the same
// cost model (transfer/cost) and eviction policies (eviction) the daemons
// use, never copies of them.
//
// It is pure: no goroutines, no wall clock (time.Time values only carry
// simulated time to the eviction policies), no I/O beyond the reader a
// trace is parsed from. Time is simulated seconds, a float64, from the
// trace's first request; the same inputs and seed give the same result.
//
// This file's siblings so far: the trace reader (trace.go), the event
// queue (events.go), links shared by concurrent fetches (link.go), the
// decode roofline (decode.go) and the cache tiers (tier.go).
package sim

// Package pool is the kvpool node: a shared-memory arena mapped outside the
// Go heap, the allocator and block index over it, two-phase puts, and the
// servers that expose it (gRPC, the framed TCP data channel, and the unix
// socket that hands same-host clients the segment).
package pool

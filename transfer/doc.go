// Package transfer moves blocks between nodes and measures every link: a
// transport interface shaped like one-sided RDMA (transport.go documents
// how RDMA verbs map onto it) with tcp, grpc and shm implementations, a
// fault-injecting wrapper, and per-link bandwidth and latency estimates
// (Links). The pure fetch-versus-recompute cost model, which reads those
// estimates, is the subpackage cost. It imports api only.
package transfer

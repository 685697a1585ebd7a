// Package transfer moves blocks between nodes and measures every link: a
// transport interface shaped like one-sided RDMA with tcp, grpc and shm
// implementations, per-link bandwidth and latency estimates, and the pure
// fetch-versus-recompute cost model. It imports api only.
//
// It is the next milestone after the node (pool); until then the package
// holds no code.
package transfer

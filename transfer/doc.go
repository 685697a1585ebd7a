// Package transfer moves block bytes between nodes and measures every
// link.
//
// The Transport interface is shaped like one-sided RDMA, so an RDMA
// implementation can be added without changing callers:
//
//	RDMA verbs                          Transport
//	ibv_reg_mr(pd, addr, len) → rkey    Register(id, mem): id plays the rkey
//	ibv_dereg_mr                        Deregister(id)
//	exchange (addr, rkey) out of band   the peer's Pin RPC returns (region, offset, length)
//	ibv_post_send(RDMA_READ/WRITE)      Submit(ctx, ops): one work request per Op
//	ibv_poll_cq / completion channel    Batch.Poll / Batch.Wait
//	QP error state, flush               the ctx of Submit cancels the batch; ops fail
//
// As with RDMA, a peer's memory is named by (region, offset) and nothing
// on the data path looks a block up by key: the control plane (pinning
// blocks on the holder, which keeps their bytes in place) happens before,
// and the bytes move without the holder's CPU touching them beyond the
// kernel copy (tcp), a stream (grpc) or a memcpy by the reader (shm).
//
// Three transports implement it: TCP (framed requests spread over a few
// connections per peer, each pulling the next as it drains), GRPC (streams with a raw-bytes codec) and SHM
// (peers on the same host, read by mapping their memory). Protocol names
// them in a node's configuration. Faulty wraps any of them to inject
// faults in tests. Ops fail with ErrNoRegion, ErrPeer or ErrClosed, which
// classify as api errors (api.ErrNotFound, api.ErrUnavailable), or with
// the context's error.
//
//	b := tr.Submit(ctx, []transfer.Op{{Kind: transfer.Read, Peer: addr, Region: id, Offset: off, Local: buf, Checksum: true}})
//	<-b.Done() // buf is the caller's again; cancelling ctx ends the batch early
//	if err := b.Err(); err != nil { ... }
//	crc := b.OpCRC(0) // of the bytes that arrived in buf
//
// The package also keeps per-link bandwidth and latency estimates
// (Links), fed from transfers as they happen (Batch.FirstResponse and
// Batch.Bytes). They are what the node feeds the fetch-versus-recompute
// cost model, the subpackage cost, which imports nothing from this
// package. Of this module, transfer imports api only; beyond the standard
// library it uses gRPC and golang.org/x/sys.
package transfer

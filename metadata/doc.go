// Package metadata is the cluster map every daemon shares: who is in the
// pool, which node holds which block, what each tenant's policy is and how
// fast the links between nodes are.
//
// Most of it lives in etcd, under one prefix (default "/kvpool/"; the key
// layout is in records.go):
//
//   - Member is a node's presence: its NodeRecord and the log of its block
//     locations, written in coalesced, compactly encoded batches (Batch) on
//     the node's lease, so a dead node's records leave etcd with it. A lease
//     is an epoch: after a lost lease the node writes its whole set again.
//     Member also publishes the node's measured links (NodeLinks).
//   - Mirror is every daemon's local copy of the location index and of the
//     link matrix, fed by one range read and then a watch; Locate and
//     Holders are answered from memory.
//   - Policies stores per-tenant policy records, with no lease; the mirror
//     hands changes to its OnPolicy callback.
//
// Gossip runs memberlist among daemons beside etcd: it declares a dead
// node within a second or two, well before its lease expires (mirrors
// leave it out at once), and spreads every node's Load.
//
// The package imports api, the etcd client (with gRPC's dial options and
// zap, to configure it) and memberlist. It does not import the etcd
// server: etcd for one machine and for tests is started by package
// metadata/embedded, which only cmd and tests import. Nor does it import
// pool, transfer or eviction: the node wires this package in, through
// callbacks such as MemberConfig.Snapshot and MirrorConfig.OnPolicy.
//
// Member, Mirror and Gossip do their work in Run(ctx), which returns once
// their goroutines have stopped; NewMember and NewMirror only validate,
// while NewGossip already starts memberlist on its port (see NewGossip).
// Loggers come from the configs: they should already carry the node's id,
// and each component adds its own name under "component".
package metadata

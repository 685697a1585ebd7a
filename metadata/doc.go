// Package metadata is the cluster map: node records and block locations in
// etcd bound to node leases, a watch-fed local mirror of the location index
// in every daemon, embedded etcd for one machine, and memberlist gossip for
// fast liveness and load. It imports api only.
//
// It is the milestone after the node (pool); until then the package holds
// no code.
package metadata

package metadata

import (
	"encoding/hex"
	"slices"
	"sort"
	"strings"
)

// state is the mirrored location index: which node holds which block. It
// is pure data: no goroutines, no I/O, not safe for concurrent use (the
// Mirror guards it). Blocks map to interned holder sets, so a block held
// by several nodes costs one map entry, and a cluster of any size fits.
type state struct {
	nodes  map[string]*nodeState
	slots  []string          // slot -> node id, "" when free
	blocks map[string]uint32 // tenant\0namespace\0key -> holder set id
	sets   holderSets
	// links holds each node's published links record, by node, with
	// Links sorted by peer. Independent of nodes: a node's links and its
	// record leave etcd together with its lease.
	links map[string]NodeLinks
	// scratch builds block keys for lookups without allocating.
	scratch []byte
}

// nodeState is what the mirror knows of one node.
type nodeState struct {
	rec  NodeRecord
	slot uint16
	// next is the seq the mirror expects next in rec.Epoch.
	next uint64
	// following is true when every batch of this epoch since the mirror
	// started following it was applied: a snapshot then carries nothing
	// new and is skipped instead of replacing the node's set.
	following bool
	// inSnapshot is set between a snapshot's first and last part, which
	// started at seq snapshotFrom; pending collects its records when the
	// mirror must apply it.
	inSnapshot   bool
	snapshotFrom uint64
	pending      []Record
	blocks       int
}

func newState() *state {
	return &state{nodes: map[string]*nodeState{}, blocks: map[string]uint32{}, sets: newHolderSets(), links: map[string]NodeLinks{}}
}

// setLinks stores a validated links record, replacing the node's previous
// one. The state keeps rec.Links sorted by peer; it owns rec from now on.
func (s *state) setLinks(rec NodeLinks) {
	slices.SortFunc(rec.Links, func(a, b LinkRecord) int { return strings.Compare(a.Peer, b.Peer) })
	s.links[rec.Node] = rec
}

// dropLinks forgets a node's links record.
func (s *state) dropLinks(node string) { delete(s.links, node) }

func (s *state) blockKey(tenant, namespace, key string) []byte {
	s.scratch = append(append(append(append(append(s.scratch[:0], tenant...), 0), namespace...), 0), key...)
	return s.scratch
}

// upsertNode records a node's record. A new epoch forgets everything the
// node published before: a node that lost its lease republishes its whole
// set in the new epoch.
func (s *state) upsertNode(rec NodeRecord) {
	n, ok := s.nodes[rec.ID]
	if ok && n.rec.Epoch == rec.Epoch {
		n.rec = rec
		return
	}
	if ok {
		s.clearNode(n)
	} else {
		n = &nodeState{slot: s.allocSlot(rec.ID)}
		s.nodes[rec.ID] = n
	}
	n.rec, n.next, n.following, n.inSnapshot, n.pending = rec, 0, true, false, nil
}

// dropNode forgets a node and every block it held.
func (s *state) dropNode(id string) {
	n, ok := s.nodes[id]
	if !ok {
		return
	}
	s.clearNode(n)
	s.slots[n.slot] = ""
	delete(s.nodes, id)
}

func (s *state) allocSlot(id string) uint16 {
	for i, v := range s.slots {
		if v == "" {
			s.slots[i] = id
			return uint16(i)
		}
	}
	s.slots = append(s.slots, id)
	return uint16(len(s.slots) - 1)
}

// clearNode removes the node's slot from every block: a walk of all
// blocks, with each holder set's replacement computed once.
func (s *state) clearNode(n *nodeState) {
	if n.blocks == 0 {
		return
	}
	memo := map[uint32]uint32{}
	for k, id := range s.blocks {
		nid, ok := memo[id]
		if !ok {
			nid = s.sets.without(id, n.slot)
			memo[id] = nid
		}
		if nid == id {
			continue
		}
		s.sets.release(id)
		if nid == 0 {
			delete(s.blocks, k)
		} else {
			s.sets.retain(nid)
			s.blocks[k] = nid
		}
	}
	n.blocks = 0
}

func (s *state) add(n *nodeState, r *Record) {
	k := s.blockKey(r.Tenant, r.Namespace, r.Key)
	id := s.blocks[string(k)]
	nid := s.sets.with(id, n.slot)
	if nid == id {
		return
	}
	s.sets.retain(nid)
	if id != 0 {
		s.sets.release(id)
	}
	s.blocks[string(k)] = nid
	n.blocks++
}

func (s *state) remove(n *nodeState, r *Record) {
	k := s.blockKey(r.Tenant, r.Namespace, r.Key)
	id, ok := s.blocks[string(k)]
	if !ok {
		return
	}
	nid := s.sets.without(id, n.slot)
	if nid == id {
		return
	}
	s.sets.release(id)
	if nid == 0 {
		delete(s.blocks, string(k))
	} else {
		s.sets.retain(nid)
		s.blocks[string(k)] = nid
	}
	n.blocks--
}

// applyBatch applies batch seq of node id's epoch. It reports false when
// the batch is ignored: an unknown node, an old epoch, or a seq already
// applied.
func (s *state) applyBatch(id string, epoch int64, seq uint64, b *Batch) bool {
	n, ok := s.nodes[id]
	if !ok || n.rec.Epoch != epoch || seq < n.next {
		return false
	}
	if seq != n.next {
		n.following = false // a gap: only a snapshot can make us whole
	}
	n.next = seq + 1
	if !b.Snapshot {
		n.inSnapshot, n.pending = false, nil
		for i := range b.Records {
			switch b.Records[i].Op {
			case OpAdd:
				s.add(n, &b.Records[i])
			case OpRemove:
				s.remove(n, &b.Records[i])
			}
		}
		return true
	}
	switch {
	case b.Part == 0:
		n.inSnapshot, n.snapshotFrom, n.pending = true, seq, nil
	case !n.inSnapshot || n.snapshotFrom+uint64(b.Part) != seq:
		n.inSnapshot, n.pending = false, nil // parts of a snapshot we saw no start of
		return true
	}
	apply := b.Reset || !n.following
	if apply {
		n.pending = append(n.pending, b.Records...)
	}
	if b.Part == b.Parts-1 {
		// A mirror that followed every batch already holds what a
		// compaction snapshot says; one that did not, and every mirror
		// for a reset, replaces the node's set with it.
		if apply {
			s.clearNode(n)
			for i := range n.pending {
				s.add(n, &n.pending[i])
			}
			n.following = true
		}
		n.inSnapshot, n.pending = false, nil
	}
	return true
}

// holders returns the node slots holding a block. buf is scratch for the
// block key; it is safe for concurrent readers.
func (s *state) holders(buf []byte, tenant, namespace string, key []byte) []uint16 {
	buf = append(append(append(append(append(buf[:0], tenant...), 0), namespace...), 0), key...)
	id, ok := s.blocks[string(buf)]
	if !ok {
		return nil
	}
	return s.sets.members(id)
}

// NodePrefix is how many leading blocks of a chain one node holds.
type NodePrefix struct {
	Node   string `json:"node"`
	Blocks int    `json:"blocks"`
}

// LocateResult answers Locate for one chain.
type LocateResult struct {
	// ChainBlocks is the length of the chain asked about.
	ChainBlocks int `json:"chain_blocks"`
	// Nodes lists every live node with its leading-block count, deepest
	// first, then by id.
	Nodes []NodePrefix `json:"nodes"`
	// Deepest is the longest prefix one node holds, DeepestNodes the nodes
	// that hold it.
	Deepest      int      `json:"deepest"`
	DeepestNodes []string `json:"deepest_nodes"`
	// PoolPrefix is the longest prefix whose every block some live node
	// holds, possibly different nodes for different blocks: what can be
	// fetched instead of recomputed.
	PoolPrefix int `json:"pool_prefix"`
}

// locate walks the chain once. dead reports nodes to leave out. It only
// reads the state, so concurrent calls are safe.
func (s *state) locate(tenant, namespace string, chain [][]byte, dead func(string) bool) LocateResult {
	var buf [2*64 + 128 + 2]byte
	res := LocateResult{ChainBlocks: len(chain)}
	counts := make([]int, len(s.slots))
	running := make([]bool, len(s.slots))
	live := make([]bool, len(s.slots))
	nRunning := 0
	for i, id := range s.slots {
		if id != "" && (dead == nil || !dead(id)) {
			live[i], running[i] = true, true
			nRunning++
		}
	}
	pool := true
	for i, k := range chain {
		if nRunning == 0 && !pool {
			break
		}
		held := s.holders(buf[:0], tenant, namespace, k)
		any := false
		for _, slot := range held {
			if live[slot] {
				any = true
			}
		}
		if pool && any {
			res.PoolPrefix = i + 1
		} else {
			pool = false
		}
		for slot := range running {
			if running[slot] && !slices.Contains(held, uint16(slot)) {
				running[slot] = false
				nRunning--
			}
		}
		for slot := range running {
			if running[slot] {
				counts[slot] = i + 1
			}
		}
	}
	for slot, id := range s.slots {
		if live[slot] {
			res.Nodes = append(res.Nodes, NodePrefix{Node: id, Blocks: counts[slot]})
		}
	}
	sort.Slice(res.Nodes, func(a, b int) bool {
		if res.Nodes[a].Blocks != res.Nodes[b].Blocks {
			return res.Nodes[a].Blocks > res.Nodes[b].Blocks
		}
		return res.Nodes[a].Node < res.Nodes[b].Node
	})
	for _, np := range res.Nodes {
		if np.Blocks > 0 && np.Blocks >= res.Deepest {
			res.Deepest = np.Blocks
			res.DeepestNodes = append(res.DeepestNodes, np.Node)
		}
	}
	return res
}

// holderSets interns sorted sets of node slots. Set 0 is the empty set.
type holderSets struct {
	sets  [][]uint16
	refs  []int
	index map[string]uint32
	free  []uint32
}

func newHolderSets() holderSets {
	return holderSets{sets: [][]uint16{nil}, refs: []int{1}, index: map[string]uint32{"": 0}}
}

func setName(members []uint16) string {
	b := make([]byte, 0, 2*len(members))
	for _, m := range members {
		b = append(b, byte(m), byte(m>>8))
	}
	return string(b)
}

func (h *holderSets) intern(members []uint16) uint32 {
	name := setName(members)
	if id, ok := h.index[name]; ok {
		return id
	}
	var id uint32
	if k := len(h.free); k > 0 {
		id = h.free[k-1]
		h.free = h.free[:k-1]
		h.sets[id], h.refs[id] = members, 0
	} else {
		id = uint32(len(h.sets))
		h.sets = append(h.sets, members)
		h.refs = append(h.refs, 0)
	}
	h.index[name] = id
	return id
}

func (h *holderSets) members(id uint32) []uint16 { return h.sets[id] }

// with returns the id of set id plus slot.
func (h *holderSets) with(id uint32, slot uint16) uint32 {
	m := h.sets[id]
	i, found := slices.BinarySearch(m, slot)
	if found {
		return id
	}
	return h.intern(slices.Insert(slices.Clone(m), i, slot))
}

// without returns the id of set id minus slot.
func (h *holderSets) without(id uint32, slot uint16) uint32 {
	m := h.sets[id]
	i, found := slices.BinarySearch(m, slot)
	if !found {
		return id
	}
	return h.intern(slices.Delete(slices.Clone(m), i, i+1))
}

func (h *holderSets) retain(id uint32) { h.refs[id]++ }

func (h *holderSets) release(id uint32) {
	if id == 0 {
		return
	}
	h.refs[id]--
	if h.refs[id] == 0 {
		delete(h.index, setName(h.sets[id]))
		h.sets[id] = nil
		h.free = append(h.free, id)
	}
}

// nodeRecords returns up to limit (0: no limit) of the blocks node id
// holds, as adds, in no particular order: the admin blocks listing.
func (s *state) nodeRecords(id string, limit int) []Record {
	n, ok := s.nodes[id]
	if !ok {
		return nil
	}
	var out []Record
	for k, set := range s.blocks {
		if _, found := slices.BinarySearch(s.sets.sets[set], n.slot); !found {
			continue
		}
		t, rest, _ := strings.Cut(k, "\x00")
		ns, key, _ := strings.Cut(rest, "\x00")
		out = append(out, Record{Op: OpAdd, Tenant: t, Namespace: ns, Key: key})
		if limit > 0 && len(out) >= limit {
			break
		}
	}
	return out
}

// content lists every (node, block) pair as "node tenant/namespace/hexkey",
// sorted.
func (s *state) content() []string {
	var out []string
	for k, set := range s.blocks {
		t, rest, _ := strings.Cut(k, "\x00")
		ns, key, _ := strings.Cut(rest, "\x00")
		for _, slot := range s.sets.members(set) {
			out = append(out, s.slots[slot]+" "+t+"/"+ns+"/"+hex.EncodeToString([]byte(key)))
		}
	}
	sort.Strings(out)
	return out
}

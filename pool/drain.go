package pool

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvpool/kvpool/api"
	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
	"github.com/kvpool/kvpool/pool/store"
)

// A drain: the node leaves the cluster without losing what only it holds.
//
//  1. The store refuses new blocks and leases (store.SetDraining): puts,
//     reservations, commits of earlier reservations, incoming fetches and
//     Locate or Lease calls that ask for a lease get Unavailable, so
//     clients go to another node. /readyz and the gRPC health service say
//     NOT_SERVING. Reads go on.
//  2. Every block in memory that no other live node holds is handed off:
//     a peer is asked, with a Fetch frame, to pull it from this node.
//     Leased blocks go first, then each tenant's hottest by its policy
//     (store.Hottest), spread over the live peers; a block a peer cannot
//     take is offered to the others, while the budget lasts.
//  3. A leased block that is still only here is waited for until its
//     lease ends, within the same budget.
//  4. Run stops the node: its etcd lease is revoked, so its records leave
//     the cluster map at once.
//
// Blocks on the disk tier stay there, for the node's return; the drain
// counts memory only.

// DrainReport says what a drain did.
type DrainReport struct {
	// Blocks and Bytes were in memory when the drain began.
	Blocks int   `json:"blocks"`
	Bytes  int64 `json:"bytes"`
	// Replicated blocks were already held by another live node.
	Replicated int `json:"replicated_blocks"`
	// HandedOff blocks were pulled by a peer that lacked them.
	HandedOff      int   `json:"handed_off_blocks"`
	HandedOffBytes int64 `json:"handed_off_bytes"`
	// Kept blocks were only here when the drain ended: no peer took them
	// within the budget (or there was no peer). They go with the node.
	Kept int `json:"kept_blocks"`
	// LeasedKept of the Kept blocks were under a read lease that
	// outlasted the budget.
	LeasedKept int `json:"leased_kept_blocks"`
	// PeerBlocks is how many blocks each peer pulled.
	PeerBlocks map[string]int `json:"peer_blocks"`
	// HandOff is how long the hand-off took, LeaseWait the wait for
	// leases after it, Took the whole drain.
	HandOff   time.Duration `json:"hand_off"`
	LeaseWait time.Duration `json:"lease_wait"`
	Took      time.Duration `json:"took"`
	// Errors are the distinct reasons blocks were not handed off (at most
	// maxDrainErrors).
	Errors []string `json:"errors,omitempty"`
}

const maxDrainErrors = 8

// drainState is the node's one drain: started once, shared by every
// caller.
type drainState struct {
	mu      sync.Mutex
	started bool
	// done closes when the drain has ended; Run then stops the node.
	done   chan struct{}
	report DrainReport
	err    error
}

// errNotServing is Drain before Run serves.
var errNotServing = api.Errorf(api.ErrFailedPrecondition, "pool: the node is not serving yet, so it cannot drain")

// Drain drains the node (see the steps above) within budget (0: the
// configured DrainBudget), then makes Run stop it. Callers after the
// first wait for the same drain and get its report; ctx only bounds the
// wait: a drain once started runs to its end. It needs Run serving.
func (n *Node) Drain(ctx context.Context, budget time.Duration) (DrainReport, error) {
	select {
	case <-n.ready:
	default:
		return DrainReport{}, errNotServing
	}
	if budget <= 0 {
		budget = n.cfg.DrainBudget
	}
	d := &n.drain
	d.mu.Lock()
	first := !d.started
	d.started = true
	d.mu.Unlock()
	if first {
		rep, err := n.drainNow(budget)
		d.mu.Lock()
		d.report, d.err = rep, err
		d.mu.Unlock()
		close(d.done)
	}
	select {
	case <-d.done:
	case <-ctx.Done():
		return DrainReport{}, ctx.Err()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.report, d.err
}

// Draining reports whether a drain has begun.
func (n *Node) Draining() bool { return n.store.Draining() }

// drainNow runs the drain. The node's serving context ends it early (a
// service failed); so does the budget.
func (n *Node) drainNow(budget time.Duration) (DrainReport, error) {
	start := n.cfg.Now()
	ctx, cancel := context.WithTimeout(n.serving, budget)
	defer cancel()
	deadline, _ := ctx.Deadline()
	n.store.SetDraining(true)
	n.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	n.health.SetServingStatus(kvpoolv1.KVPoolService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	n.metrics.draining.Set(1)
	n.log.Info("draining: taking no new blocks or leases", "budget", budget)

	blocks := n.store.Hottest(start)
	rep := DrainReport{Blocks: len(blocks), PeerBlocks: map[string]int{}}
	for _, b := range blocks {
		rep.Bytes += b.Size
	}
	var only []store.HeldBlock // held by no other live node
	peers := n.drainPeers()
	for _, b := range blocks {
		if n.heldElsewhere(b) {
			rep.Replicated++
		} else {
			only = append(only, b)
		}
	}
	left := only
	if len(peers) > 0 && len(only) > 0 {
		n.untilPublished(ctx)
		left = n.handOff(ctx, only, peers, &rep)
	} else if len(only) > 0 {
		rep.Errors = append(rep.Errors, "no live peer to hand blocks to")
	}
	rep.HandOff = n.cfg.Now().Sub(start)

	// Leased blocks still only here: wait out their leases (none can be
	// taken or extended now), within the budget.
	waitStart := n.cfg.Now()
	for {
		latest := time.Time{}
		now := n.cfg.Now()
		for _, b := range left {
			if until := n.store.LeasedUntil([]byte(b.Tenant), []byte(b.Namespace), b.Key, now); until.After(latest) {
				latest = until
			}
		}
		if latest.IsZero() || ctx.Err() != nil {
			break
		}
		wait := time.NewTimer(min(latest.Sub(now), deadline.Sub(now)) + time.Millisecond)
		select {
		case <-ctx.Done():
		case <-wait.C:
		}
		wait.Stop()
	}
	now := n.cfg.Now()
	rep.LeaseWait = now.Sub(waitStart)
	rep.Kept = len(left)
	for _, b := range left {
		if !n.store.LeasedUntil([]byte(b.Tenant), []byte(b.Namespace), b.Key, now).IsZero() {
			rep.LeasedKept++
		}
	}
	rep.Took = now.Sub(start)
	n.metrics.drainedBlocks.WithLabelValues("replicated").Add(float64(rep.Replicated))
	n.metrics.drainedBlocks.WithLabelValues("handed_off").Add(float64(rep.HandedOff))
	n.metrics.drainedBlocks.WithLabelValues("kept").Add(float64(rep.Kept))
	level := slog.LevelInfo
	if rep.Kept > 0 {
		level = slog.LevelWarn // blocks leave with the node
	}
	n.log.Log(context.Background(), level, "drained", "blocks", rep.Blocks, "bytes", rep.Bytes, "replicated", rep.Replicated, "handed_off", rep.HandedOff,
		"handed_off_bytes", rep.HandedOffBytes, "kept", rep.Kept, "leased_kept", rep.LeasedKept, "hand_off", rep.HandOff.String(),
		"lease_wait", rep.LeaseWait.String(), "took", rep.Took.String(), "errors", rep.Errors)
	if err := n.serving.Err(); err != nil {
		return rep, fmt.Errorf("pool: drain cut short: the node is stopping: %w", err)
	}
	return rep, nil
}

// untilPublished waits, within ctx, until the member has written every
// location change it queued: the peers can only pull blocks their maps
// list here.
func (n *Node) untilPublished(ctx context.Context) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for n.cluster.member.Pending() > 0 {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// drainPeer is a live peer a drain may hand blocks to.
type drainPeer struct{ id, addr string }

// drainPeers are the other live nodes, in id order.
func (n *Node) drainPeers() []drainPeer {
	if n.cluster == nil {
		return nil
	}
	var out []drainPeer
	for _, ni := range n.cluster.Nodes() {
		r := ni.Record
		if r.ID == n.cfg.NodeID || n.cluster.Dead(r.ID) || r.Addrs[addrGRPC] == "" {
			continue
		}
		out = append(out, drainPeer{id: r.ID, addr: r.Addrs[addrGRPC]})
	}
	slices.SortFunc(out, func(a, b drainPeer) int { return cmp.Compare(a.id, b.id) })
	return out
}

// heldElsewhere reports whether another live node holds b.
func (n *Node) heldElsewhere(b store.HeldBlock) bool {
	if n.cluster == nil {
		return false
	}
	for _, h := range n.cluster.Holders(b.Tenant, b.Namespace, b.Key) {
		if h.ID != n.cfg.NodeID && !n.cluster.Dead(h.ID) {
			return true
		}
	}
	return false
}

// handOffChunk is blocks of one tenant and namespace, in hand-off order,
// for one Fetch frame.
type handOffChunk struct {
	blocks []store.HeldBlock
	tried  map[string]bool // peers that failed them
}

// handOff asks the peers to pull blocks, every peer working through its
// share at once, hottest first; blocks a peer could not take go round
// the others. It returns the blocks no peer took before ctx ended.
func (n *Node) handOff(ctx context.Context, blocks []store.HeldBlock, peers []drainPeer, rep *DrainReport) []store.HeldBlock {
	// Chunks of one namespace each, in the order of their hottest block.
	var queue []*handOffChunk
	open := map[[2]string]*handOffChunk{}
	for _, b := range blocks {
		ns := [2]string{b.Tenant, b.Namespace}
		c := open[ns]
		if c == nil {
			c = &handOffChunk{tried: map[string]bool{}}
			open[ns] = c
			queue = append(queue, c)
		}
		if c.blocks = append(c.blocks, b); len(c.blocks) == n.cfg.DrainChainBlocks {
			delete(open, ns)
		}
	}
	var (
		mu       sync.Mutex
		cond     = sync.NewCond(&mu)
		inFlight int
		left     []store.HeldBlock // no peer left to try
		errSeen  = map[string]bool{}
	)
	noteErr := func(msg string) {
		if msg != "" && !errSeen[msg] && len(rep.Errors) < maxDrainErrors {
			errSeen[msg] = true
			rep.Errors = append(rep.Errors, msg)
		}
	}
	stop := context.AfterFunc(ctx, func() { mu.Lock(); cond.Broadcast(); mu.Unlock() })
	defer stop()
	// next takes the first chunk peer has not failed, waiting while other
	// peers' chunks are in flight (they may come back for this one).
	next := func(peer string) *handOffChunk {
		mu.Lock()
		defer mu.Unlock()
		for ctx.Err() == nil {
			for i, c := range queue {
				if !c.tried[peer] {
					queue = slices.Delete(queue, i, i+1)
					inFlight++
					return c
				}
			}
			if inFlight == 0 {
				return nil
			}
			cond.Wait()
		}
		return nil
	}
	var wg sync.WaitGroup
	for _, p := range peers {
		wg.Go(func() {
			for c := next(p.id); c != nil; c = next(p.id) {
				took, unknown, msg := n.askToPull(ctx, p, c.blocks)
				var failed, later []store.HeldBlock
				mu.Lock()
				for i, b := range c.blocks {
					switch {
					case took[i]:
						rep.HandedOff++
						rep.HandedOffBytes += b.Size
						rep.PeerBlocks[p.id]++
					case unknown[i]:
						later = append(later, b)
					default:
						failed = append(failed, b)
					}
				}
				retry := &handOffChunk{blocks: later, tried: maps.Clone(c.tried)}
				if len(failed) > 0 {
					noteErr(msg)
					c.blocks = failed
					c.tried[p.id] = true
					if len(c.tried) < len(peers) {
						queue = append(queue, c)
					} else {
						left = append(left, failed...)
					}
				}
				if len(later) > 0 {
					// The peer's map has not heard of these yet (they
					// were committed moments ago): offer them again
					// shortly, to any peer.
					mu.Unlock()
					wait := time.NewTimer(notPublishedRetry)
					select {
					case <-ctx.Done():
					case <-wait.C:
					}
					wait.Stop()
					mu.Lock()
					queue = append(queue, retry)
				}
				inFlight--
				cond.Broadcast()
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, c := range queue { // never reached: the budget ran out
		left = append(left, c.blocks...)
	}
	return left
}

// notPublishedRetry is how long a drain waits before it offers again a
// block a peer's map did not know of yet.
const notPublishedRetry = 100 * time.Millisecond

// askToPull asks peer to fetch blocks (one tenant and namespace) from
// this node. took says which blocks the peer now holds, unknown which
// the peer's map does not list here yet (NotFound); why is a reason the
// others were not taken.
func (n *Node) askToPull(ctx context.Context, p drainPeer, blocks []store.HeldBlock) (took, unknown []bool, why string) {
	took, unknown = make([]bool, len(blocks)), make([]bool, len(blocks))
	keys := make([][]byte, len(blocks))
	for i, b := range blocks {
		keys[i] = b.Key
	}
	deadline, _ := ctx.Deadline()
	conn, _, err := n.fetcher.peers.Get(ctx, p.addr)
	if err != nil {
		return took, unknown, fmt.Sprintf("reach %s: %v", p.id, err)
	}
	res, err := api.FetchOver(ctx, conn, blocks[0].Tenant, blocks[0].Namespace, keys, time.Until(deadline))
	n.fetcher.peers.Put(p.addr, conn)
	if err != nil {
		return took, unknown, fmt.Sprintf("ask %s to pull: %v", p.id, err)
	}
	for i, r := range res {
		took[i] = r.Err == nil
		unknown[i] = errors.Is(r.Err, api.ErrNotFound)
		if r.Err != nil && !unknown[i] && why == "" {
			why = fmt.Sprintf("%s: %v", p.id, r.Err)
		}
	}
	return took, unknown, why
}

package pool

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/wire"
	"github.com/kvpool/kvpool/metadata"
	"github.com/kvpool/kvpool/pool/store"
	"github.com/kvpool/kvpool/transfer"
)

// arenaRegion is the transfer region id under which a node exposes its
// arena to peers. Offsets are the ones its pins report.
const arenaRegion transfer.RegionID = 1

// Keys of NodeRecord.Addrs.
const (
	addrGRPC   = "grpc"   // gRPC, the data channel and the tcp transport
	addrGossip = "gossip" // memberlist
	addrShm    = "shm"    // the shm transport's unix socket
	addrHost   = "host"   // the host's identity (api.HostID)
)

// fetchStore is what moving blocks between nodes needs of the store.
// *store.Store implements it.
type fetchStore interface {
	blockWriter
	blockReader
	Exists(tenant, ns []byte, keys [][]byte) ([]bool, error)
	Locate(tenant, ns []byte, chain [][]byte) (int, error)
}

// promoter brings blocks from a node's disk tier into memory. *tiers
// implements it; a store without a disk does not.
type promoter interface {
	Promote(tenant, ns []byte, keys [][]byte) []error
}

// holderView is what the fetcher needs to know of the cluster: who holds
// a block and which nodes are alive. *cluster implements it; nil means
// the node runs standalone.
type holderView interface {
	Holders(tenant, namespace string, key []byte) []metadata.NodeRecord
	Nodes() []metadata.NodeInfo
	Dead(id string) bool
	Peers() []metadata.Peer
}

// fetcher moves blocks between this node and its peers: Fetch pulls the
// blocks a chain lacks, Replicate pushes copies of a block (replicate.go),
// Route says where blocks are for clients that read them themselves. The
// control plane (pins, reservations, commits on the peer) goes over
// data-channel connections to the peer; the bytes over the transport.
type fetcher struct {
	self, zone, hostID string
	advertise          string // this node's address for clients
	timeout            time.Duration
	store              fetchStore
	cluster            holderView // nil: standalone
	links              *transfer.Links
	// pull is the transport blocks are pulled and pushed with; shmPull,
	// when set, the one for peers on this host.
	pull, shmPull transfer.Transport
	peers         *wire.Pool
	fetched       *prometheus.CounterVec // bytes, by transport
	fetchedBlocks *prometheus.CounterVec // blocks, by how they were addressed
	sizes         blockSizes             // per namespace: the size named reads ask for
	fetchFailures *prometheus.CounterVec // blocks not pulled, by reason
	// overheads are what callers report their calls cost beyond the
	// fetch; callOverhead shows their median (nil: not exported).
	overheads    callOverheads
	callOverhead prometheus.Gauge
	now          func() time.Time
	log          *slog.Logger
}

// newPeerPool keeps data-channel connections to peers: the control plane
// of transfers.
// creds are how this node identifies itself to its peers (see
// gatekeeper.peerCredentials); congestion is ServerConfig.TCPCongestion.
func newPeerPool(tlsFor func(addr string) *tls.Config, token, congestion string) *wire.Pool {
	return &wire.Pool{Dial: func(ctx context.Context, addr string) (*wire.Conn, error) {
		// Status makes a peer's refusals arrive as the same sentinel
		// errors as everywhere else (the one table).
		return wire.Dial(ctx, addr, wire.ConnConfig{Status: api.FromWireStatus, TLS: tlsFor(addr), Token: token, Congestion: congestion})
	}}
}

// Fetch makes the blocks under keys local. Each missing key is pulled from
// the live holder with the best measured link: the holder pins it (its
// bytes stay put), the transport reads them one-sidedly into a local
// reservation, the bytes are checked against the holder's checksum, and
// the block is committed here as a replica (and published like a Put). A
// holder that fails or times out (timeout, default Config.FetchTimeout)
// or sends bytes that fail their checksum is replaced by the next holder
// (api.PullFromHolders, the loop GetDirect uses too).
// Errors per key: ErrNotFound (no holder), ErrUnavailable, ErrDataLoss.
//
// answer, when not nil, is called with the results the moment they are
// final (every block committed here or failed), before the bookkeeping
// that follows: the holders' pins released, the chain's order told to the
// policies, the links' fits. A caller that writes its response in answer
// spares its client that wait. Fetch returns the same results after.
func (f *fetcher) Fetch(ctx context.Context, tenant, namespace string, keys [][]byte, timeout time.Duration, answer func([]api.FetchResult)) ([]api.FetchResult, error) {
	if err := api.ValidateChain(tenant, namespace, keys); err != nil {
		return nil, err
	}
	if timeout <= 0 {
		timeout = f.timeout
	}
	begin := time.Now()
	exists, err := f.store.Exists([]byte(tenant), []byte(namespace), keys)
	if err != nil {
		return nil, err
	}
	if p, ok := f.store.(promoter); ok {
		// Blocks on the local disk come into memory first; one the disk
		// fails to serve is fetched from a peer like a missing one.
		for i, err := range p.Promote([]byte(tenant), []byte(namespace), keys) {
			exists[i] = exists[i] && err == nil
		}
	}
	out := make([]api.FetchResult, len(keys))
	errs := make([]error, len(keys))
	holders := make([][]metadata.NodeRecord, len(keys))
	now := f.now()
	for i, ok := range exists {
		switch {
		case ok:
		case f.cluster == nil:
			errs[i] = api.Errorf(api.ErrNotFound, "pool: no block %s/%s/%x here, and the node runs standalone", tenant, namespace, keys[i])
		default:
			if holders[i] = f.peerHolders(tenant, namespace, keys[i], now); len(holders[i]) == 0 {
				errs[i] = api.Errorf(api.ErrNotFound, "pool: no live node holds %s/%s/%x", tenant, namespace, keys[i])
			}
		}
	}
	var (
		mu    sync.Mutex
		after []func(beyond time.Duration) // each holder's bookkeeping, run once out is answered
	)
	api.PullFromHolders(ctx, holders, errs, func(h metadata.NodeRecord) string { return h.ID },
		func(ctx context.Context, h metadata.NodeRecord, items []int) []error {
			errs, done := f.pullFrom(ctx, h, tenant, namespace, keys, items, timeout, begin, out)
			if done != nil {
				mu.Lock()
				after = append(after, done)
				mu.Unlock()
			}
			return errs
		})
	for i := range out {
		out[i].Err = errs[i]
	}
	// What answering took counts in the links' fits, or what the callers
	// report calls of this length cost beyond the fetch once they have: a
	// fetch is over for its caller when the answer has reached it, and
	// that is what Plan predicts.
	final := time.Now()
	if answer != nil {
		answer(out)
	}
	beyond := f.overheads.beyond(time.Since(final), len(keys))
	for _, done := range after {
		done(beyond)
	}
	// The keys come as a chain: Locate, once the blocks are here, tells
	// prefix-aware policies who follows whom.
	f.store.Locate([]byte(tenant), []byte(namespace), keys)
	return out, nil
}

// ReportCallOverhead takes a caller's report of how much longer its
// previous Fetch, of blocks keys (0: not said), took, timed around the
// call, than this node's fetch: the part of its wait the node cannot
// time (see callOverheads). An implausible report is ignored.
func (f *fetcher) ReportCallOverhead(d time.Duration, blocks int) {
	if !f.overheads.report(d, blocks) || f.callOverhead == nil {
		return
	}
	if m, ok := f.overheads.median(); ok {
		f.callOverhead.Set(m.Seconds())
	}
}

// peerHolders returns the other live nodes holding key, best measured
// link first.
func (f *fetcher) peerHolders(tenant, namespace string, key []byte, now time.Time) []metadata.NodeRecord {
	hs := slices.DeleteFunc(f.cluster.Holders(tenant, namespace, key), func(r metadata.NodeRecord) bool { return r.ID == f.self })
	if len(hs) > 1 {
		bw := make(map[string]float64, len(hs))
		for _, h := range hs {
			bw[h.ID] = f.links.Estimate(h.ID, now).BytesPerSecond
		}
		slices.SortStableFunc(hs, func(a, b metadata.NodeRecord) int { return cmp.Compare(bw[b.ID], bw[a.ID]) })
	}
	return hs
}

// transportTo picks how to move bytes to or from peer, and the address
// that transport knows the peer by: its shared memory when the node pulls
// over shm and the peer is on this host, else the configured transport.
func (f *fetcher) transportTo(peer metadata.NodeRecord) (transfer.Transport, string) {
	if f.shmPull != nil && peer.Addrs[addrShm] != "" && peer.Addrs[addrHost] == f.hostID {
		return f.shmPull, peer.Addrs[addrShm]
	}
	return f.pull, peer.Addrs[addrGRPC]
}

// pullFrom fetches keys[items...] from one holder, recording each result
// in out and returning each item's error, and the bookkeeping that is left
// once the results are final (nil: none): the pins' release, the
// connection's return to the pool, the link's observations. The caller
// runs it, once, after it has answered, with what the fetch cost its
// caller beyond the node's own timing (callOverheads.beyond).
// begin is when the Fetch began: the link's fit of a fetch's fixed cost
// counts what came before the pull too.
//
// Blocks are read by name when the transport and the holder can and the
// namespace's block size is known (a namespace's blocks are one engine's, of one
// size): the holder pins each only while it sends it, so the pull starts
// with the bytes, not a pin round trip. Otherwise, and for the blocks
// whose size turns out to differ, the holder pins them first over the
// data channel and the transport reads the pinned ranges.
func (f *fetcher) pullFrom(ctx context.Context, holder metadata.NodeRecord, tenant, namespace string, keys [][]byte, items []int, timeout time.Duration, begin time.Time, out []api.FetchResult) (_ []error, after func(beyond time.Duration)) {
	tr, peer := f.transportTo(holder)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var size uint64
	if nr, ok := tr.(transfer.NamedReader); ok && nr.ReadsByName() && holder.NamedReads {
		size = f.sizes.get(tenant, namespace)
	}
	if size == 0 {
		return f.pullPinned(ctx, holder, tr, peer, tenant, namespace, keys, items, timeout, begin, out)
	}
	p := pull{holder: holder, tr: tr, peer: peer, timeout: timeout, begin: begin}
	t, ns := []byte(tenant), []byte(namespace)
	errs := p.reserve(f, t, ns, keys, items, func(k int) (uint64, error) { return size, nil }, func(k int) transfer.Op {
		return transfer.Op{Kind: transfer.Read, Peer: peer, Name: transfer.BlockName{Tenant: t, Namespace: ns, Key: keys[items[k]]}, Checksum: true}
	})
	resized := append(p.unreserved, p.run(ctx, f, keys, items, errs, out)...)
	if len(resized) == 0 {
		return errs, p.after(f)
	}
	// Blocks of another size than the namespace's last, and those it
	// found no room for at that size: pinned, which learns their size
	// (the next named reads ask for it).
	sub := make([]int, len(resized))
	for j, k := range resized {
		sub[j] = items[k]
	}
	subErrs, subAfter := f.pullPinned(ctx, holder, tr, peer, tenant, namespace, keys, sub, timeout, begin, out)
	for j, k := range resized {
		errs[k] = subErrs[j]
	}
	done := p.after(f)
	return errs, func(beyond time.Duration) {
		if done != nil {
			done(beyond)
		}
		if subAfter != nil {
			subAfter(beyond)
		}
	}
}

// pullPinned is pullFrom's pull of blocks pinned on the holder first.
func (f *fetcher) pullPinned(ctx context.Context, holder metadata.NodeRecord, tr transfer.Transport, peer, tenant, namespace string, keys [][]byte, items []int, timeout time.Duration, begin time.Time, out []api.FetchResult) (_ []error, after func(beyond time.Duration)) {
	addr := holder.Addrs[addrGRPC]
	start := time.Now()
	fail := func(err error) []error {
		errs := make([]error, len(items))
		for k := range errs {
			errs[k] = err
		}
		f.fetchFailures.WithLabelValues(fetchUnreachable).Add(float64(len(errs)))
		return errs
	}
	pc, _, err := f.peers.Get(ctx, addr)
	if err != nil {
		return fail(api.Errorf(api.ErrUnavailable, "pool: reach %s at %s: %v", holder.ID, addr, err)), nil
	}
	// Pin every block on the holder: one pipelined round trip. The
	// connection's session owns the pins, so they also end if it drops.
	pins, err := pinOn(ctx, pc, tenant, namespace, keys, items)
	if err != nil {
		f.peers.Put(addr, pc)
		return fail(api.Errorf(api.ErrUnavailable, "pool: pin on %s: %v", holder.ID, err)), nil
	}
	pinned := time.Since(start)
	for _, pin := range pins {
		if pin.err == nil {
			f.sizes.set(tenant, namespace, pin.size)
			break
		}
	}
	p := pull{holder: holder, tr: tr, peer: peer, timeout: timeout, begin: begin, pins: pins}
	p.release = func() {
		// The bytes are here or given up on: the holder may let go of
		// them, and the connection serve the next pull.
		releaseOn(pc, pins)
		f.peers.Put(addr, pc)
		f.links.Observe(holder.ID, 0, pinned, f.now())
	}
	errs := p.reserve(f, []byte(tenant), []byte(namespace), keys, items, func(k int) (uint64, error) { return pins[k].size, pins[k].err }, func(k int) transfer.Op {
		return transfer.Op{Kind: transfer.Read, Peer: peer, Region: arenaRegion, Offset: pins[k].offset, Checksum: true}
	})
	p.run(ctx, f, keys, items, errs, out)
	return errs, p.after(f)
}

// pull is one holder's share of a Fetch, once its blocks are addressed:
// by name, or by the pins on the holder.
type pull struct {
	holder  metadata.NodeRecord
	tr      transfer.Transport
	peer    string // holder's address on tr
	timeout time.Duration
	begin   time.Time
	pins    []peerPin // by item; nil: the blocks are read by name
	release func()    // lets go of the pins; nil when named

	ops []transfer.Op
	res []*store.Reservation // by item; nil: not read
	// unreserved are the items (indexes into items) a named pull found
	// no room for at the namespace's size: the caller pins them.
	unreserved []int
	opOf       []int // by item: its op, or -1
	t0, end    time.Time
	batch      *transfer.Batch
	werr       error
}

// named reports whether the pull reads its blocks by name.
func (p *pull) named() bool { return p.pins == nil }

// reserve makes each item's local reservation, of the size sizeOf gives
// (or its error), and its op (opFor, which run completes with the
// reservation's bytes). It returns each item's error so far.
func (p *pull) reserve(f *fetcher, t, ns []byte, keys [][]byte, items []int, sizeOf func(k int) (uint64, error), opFor func(k int) transfer.Op) []error {
	errs := make([]error, len(items))
	p.ops = make([]transfer.Op, 0, len(items))
	p.res = make([]*store.Reservation, len(items))
	p.opOf = make([]int, len(items))
	for k := range items {
		p.opOf[k] = -1
		size, err := sizeOf(k)
		if err != nil {
			errs[k] = err
			f.fetchFailures.WithLabelValues(fetchPin).Inc()
			continue
		}
		r, err := f.store.Reserve(t, ns, keys[items[k]], int64(size), true)
		if err != nil && p.named() {
			// The size was the namespace's last, not this block's (a
			// larger one may not fit where the block itself would).
			p.unreserved = append(p.unreserved, k)
			continue
		}
		if err != nil {
			errs[k] = err
			f.fetchFailures.WithLabelValues(fetchSpace).Inc()
			continue
		}
		p.res[k] = r
		p.opOf[k] = len(p.ops)
		op := opFor(k)
		op.Local = r.Bytes()
		p.ops = append(p.ops, op)
	}
	return errs
}

// run reads the ops into their reservations, and commits each block whose
// bytes match the holder's checksum, recording it in out. It returns the
// items (indexes into items) a named read found of another size: their
// reservations are given back, their errs left for the caller.
func (p *pull) run(ctx context.Context, f *fetcher, keys [][]byte, items []int, errs []error, out []api.FetchResult) (resized []int) {
	holder := p.holder
	p.t0 = time.Now()
	batch, werr := transfer.Run(ctx, p.tr, p.ops)
	p.batch, p.werr = batch, werr
	if ctx.Err() != nil {
		// Some ops may still be writing into reservations: wait for the
		// transport to let go before giving the space back.
		<-batch.Done()
	}
	addressed := addressedByPin
	if p.named() {
		addressed = addressedByName
	}
	for k, i := range items {
		r := p.res[k]
		if r == nil {
			continue
		}
		op := p.opOf[k]
		if err := batch.OpErr(op); err != nil {
			f.store.Abort(r)
			if p.named() && errors.Is(err, transfer.ErrBlockSize) {
				resized = append(resized, k)
				continue
			}
			if ctx.Err() != nil {
				err = fmt.Errorf("%w: no answer from %s within %v", api.ErrUnavailable, holder.ID, p.timeout)
			}
			errs[k] = api.Errorf(api.ErrUnavailable, "pool: read from %s: %v", holder.ID, err)
			f.fetchFailures.WithLabelValues(fetchRead).Inc()
			continue
		}
		// The holder's checksum came with the pin or the named read's
		// response; the transport checksummed the bytes as they arrived;
		// the commit compares them.
		want := batch.OpPeerCRC(op)
		if !p.named() {
			want = p.pins[k].crc
		}
		if _, err := f.store.Commit(r, batch.OpCRC(op), true, want, true); err != nil && !errors.Is(err, api.ErrAlreadyExists) {
			errs[k] = err
			if errors.Is(err, api.ErrDataLoss) {
				f.fetchFailures.WithLabelValues(fetchChecksum).Inc()
			} else {
				f.fetchFailures.WithLabelValues(fetchSpace).Inc()
			}
			continue
		}
		size := int64(len(p.ops[op].Local))
		out[i] = api.FetchResult{Source: holder.ID, Size: size}
		f.fetched.WithLabelValues(p.tr.Name()).Add(float64(size))
		f.fetchedBlocks.WithLabelValues(addressed).Inc()
	}
	p.end = time.Now()
	for _, i := range items {
		if out[i].Source == holder.ID {
			out[i].Took = p.end.Sub(p.begin)
		}
	}
	return resized
}

// after returns the bookkeeping left once the results are answered: the
// pins' release, and the link's observations. The link's estimate is what
// a fetch delivers: bytes read and committed, usable here, per second
// after the first response (the cost model plans fetches with it).
func (p *pull) after(f *fetcher) func(beyond time.Duration) {
	batch, holder := p.batch, p.holder
	observe := len(p.ops) > 0 && (p.werr == nil || batch.Bytes() > 0)
	if !observe && p.release == nil {
		return nil
	}
	return func(beyond time.Duration) {
		if p.release != nil {
			p.release()
		}
		if !observe {
			return
		}
		if rt, ok := p.tr.(transfer.RTTReporter); ok && p.named() {
			// No pin measured the round trip. The wait for the first
			// response would overstate it (the holder pins the block and
			// starts writing it first, and on a host the two daemons
			// share it waits for a processor too): the kernel's own
			// estimate of the connection's round trip stands in.
			if d, ok := rt.RTT(p.peer); ok {
				f.links.Observe(holder.ID, 0, d, p.end)
			}
		}
		first, firstBytes := batch.FirstResponse()
		f.links.ObserveRead(holder.ID, int64(batch.Bytes()), p.t0, first, int64(firstBytes), p.end)
		if p.werr == nil {
			// The whole fetch, from the call to the commits and the
			// answer in the caller's hands, fits the link's fixed and
			// per-block costs.
			f.links.ObserveFetch(holder.ID, len(p.ops), int64(batch.Bytes()), p.end.Sub(p.begin)+beyond, p.end)
		}
		f.log.Debug("fetched", "holder", holder.ID, "bytes", batch.Bytes(), "named", p.named(), "before_read", p.t0.Sub(p.begin),
			"first_response", first.Sub(p.t0), "read_and_commit", p.end.Sub(p.t0))
	}
}

// blockSizes remembers, per tenant and namespace, the size of the last
// block pinned on a holder: the size named reads of the namespace's next
// blocks ask for. Safe for concurrent use.
type blockSizes struct {
	mu sync.Mutex
	m  map[tenantNamespace]uint64
}

type tenantNamespace struct{ tenant, namespace string }

// maxBlockSizes bounds the namespaces remembered; past it the memory
// starts over (a forgotten namespace's next pull pins first).
const maxBlockSizes = 4096

func (s *blockSizes) get(tenant, namespace string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[tenantNamespace{tenant, namespace}]
}

func (s *blockSizes) set(tenant, namespace string, size uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil || len(s.m) >= maxBlockSizes {
		s.m = make(map[tenantNamespace]uint64)
	}
	s.m[tenantNamespace{tenant, namespace}] = size
}

// Reasons of kvpool_transfer_fetch_failures_total.
const (
	fetchUnreachable = "unreachable"
	fetchPin         = "pin"
	fetchSpace       = "space"
	fetchRead        = "read"
	fetchChecksum    = "checksum"
)

// Labels of kvpool_transfer_fetched_blocks_total.
const (
	addressedByName = "name"
	addressedByPin  = "pin"
)

// peerPin is a block pinned on a peer for a pull.
type peerPin struct {
	offset, size uint64
	crc          uint32
	handle       uint64
	err          error
}

// pinOn views the blocks on the peer in one pipelined write: the pins hold
// their bytes in place until releaseOn. A refused pin is that item's
// error; the error returned is the connection's.
func pinOn(ctx context.Context, pc *wire.Conn, tenant, namespace string, keys [][]byte, items []int) ([]peerPin, error) {
	defer pc.Bind(ctx)()
	t, ns := []byte(tenant), []byte(namespace)
	for _, i := range items {
		pc.Queue(&wire.Request{Op: wire.OpView, Tenant: t, Namespace: ns, Key: keys[i]})
	}
	if err := pc.Flush(nil); err != nil {
		return nil, err
	}
	pins := make([]peerPin, len(items))
	for k := range items {
		resp, err := pc.Recv()
		if resp == nil {
			return nil, err
		}
		if err != nil {
			pins[k].err = err
			continue
		}
		pins[k] = peerPin{offset: resp.Offset, size: resp.ValueLen, crc: resp.CRC, handle: resp.Handle}
	}
	return pins, nil
}

// releaseOn drops the pins (releases have no responses).
func releaseOn(pc *wire.Conn, pins []peerPin) {
	for _, p := range pins {
		if p.err == nil {
			pc.Queue(&wire.Request{Op: wire.OpRelease, Handle: p.handle})
		}
	}
	if pc.Queued() {
		pc.Notify(nil, 5*time.Second)
	}
}

// Route is, for each key, the live nodes that hold it, best measured link
// first, this node first when it holds the key: what a client needs to
// read blocks from their holders itself. A standalone node knows only
// itself.
func (f *fetcher) Route(tenant, namespace string, keys [][]byte) ([][]api.Holder, error) {
	if err := api.ValidateChain(tenant, namespace, keys); err != nil {
		return nil, err
	}
	exists, err := f.store.Exists([]byte(tenant), []byte(namespace), keys)
	if err != nil {
		return nil, err
	}
	now := f.now()
	out := make([][]api.Holder, len(keys))
	for i, k := range keys {
		if exists[i] {
			out[i] = append(out[i], api.Holder{NodeID: f.self, Addr: f.advertise})
		}
		if f.cluster == nil {
			continue
		}
		for _, h := range f.peerHolders(tenant, namespace, k, now) {
			e := f.links.Estimate(h.ID, now)
			out[i] = append(out[i], api.Holder{NodeID: h.ID, Addr: h.Addrs[addrGRPC], BytesPerSecond: e.BytesPerSecond, RTTMicros: uint64(e.RTT / time.Microsecond)})
		}
	}
	return out, nil
}

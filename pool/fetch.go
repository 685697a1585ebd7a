package pool

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kvpool/kvpool/api"
	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
	"github.com/kvpool/kvpool/api/wire"
	"github.com/kvpool/kvpool/metadata"
	"github.com/kvpool/kvpool/transfer"
)

// arenaRegion is the transfer region id under which a node exposes its
// arena to peers. Offsets are the ones its pins report.
const arenaRegion transfer.RegionID = 1

// FetchResult says where one block of a Fetch came from.
type FetchResult struct {
	// Source is the node the bytes came from; "" when already local.
	Source string
	Size   int64
	Err    error
}

// Fetch makes the blocks under keys local. Each missing key is pulled from
// the live holder with the best measured link: the holder pins it (its
// bytes stay put), the transport reads them one-sidedly into a local
// reservation, the bytes are checked against the holder's checksum, and
// the block is committed here as a replica (and published like a Put). A
// holder that fails or times out (timeout, default Config.FetchTimeout)
// or sends bytes that fail their checksum is replaced by the next holder.
// Errors per key: ErrNotFound (no holder), ErrUnavailable, ErrDataLoss.
func (n *Node) Fetch(ctx context.Context, tenant, namespace string, keys [][]byte, timeout time.Duration) ([]FetchResult, error) {
	if err := validateChain(tenant, namespace, keys); err != nil {
		return nil, err
	}
	if timeout <= 0 {
		timeout = n.cfg.FetchTimeout
	}
	out := make([]FetchResult, len(keys))
	exists, err := n.store.Exists([]byte(tenant), []byte(namespace), keys)
	if err != nil {
		return nil, err
	}
	// The keys come as a chain: Locate, once the blocks are here, tells
	// prefix-aware policies who follows whom.
	defer n.store.Locate([]byte(tenant), []byte(namespace), keys)
	type want struct {
		i       int
		holders []metadata.NodeRecord
		tried   int
	}
	var missing []*want
	for i, ok := range exists {
		if ok {
			continue
		}
		if n.cluster == nil {
			out[i].Err = api.Errorf(api.ErrNotFound, "pool: no block %s/%s/%x here, and the node runs standalone", tenant, namespace, keys[i])
			continue
		}
		hs := n.peerHolders(tenant, namespace, keys[i], n.cfg.Now())
		if len(hs) == 0 {
			out[i].Err = api.Errorf(api.ErrNotFound, "pool: no live node holds %s/%s/%x", tenant, namespace, keys[i])
			continue
		}
		missing = append(missing, &want{i: i, holders: hs})
	}
	for len(missing) > 0 {
		// Group the keys still missing by their next holder; one batch each.
		groups := map[string][]*want{}
		recs := map[string]metadata.NodeRecord{}
		var order []string
		for _, w := range missing {
			h := w.holders[w.tried]
			if _, ok := groups[h.ID]; !ok {
				order = append(order, h.ID)
				recs[h.ID] = h
			}
			groups[h.ID] = append(groups[h.ID], w)
		}
		missing = missing[:0]
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, id := range order {
			group := groups[id]
			wg.Go(func() {
				idx := make([]int, len(group))
				for k, w := range group {
					idx[k] = w.i
				}
				res := n.pull(ctx, recs[id], tenant, namespace, keys, idx, timeout)
				mu.Lock()
				defer mu.Unlock()
				for k, w := range group {
					out[w.i] = res[k]
					if res[k].Err != nil && w.tried+1 < len(w.holders) && ctx.Err() == nil {
						w.tried++
						missing = append(missing, w)
					}
				}
			})
		}
		wg.Wait()
	}
	return out, nil
}

// peerHolders returns the other live nodes holding key, best measured
// link first.
func (n *Node) peerHolders(tenant, namespace string, key []byte, now time.Time) []metadata.NodeRecord {
	if n.cluster == nil {
		return nil
	}
	hs := slices.DeleteFunc(n.cluster.mirror.Holders(tenant, namespace, key), func(r metadata.NodeRecord) bool { return r.ID == n.cfg.NodeID })
	if len(hs) > 1 {
		bw := make(map[string]float64, len(hs))
		for _, h := range hs {
			bw[h.ID] = n.links.Estimate(h.ID, now).BytesPerSecond
		}
		slices.SortStableFunc(hs, func(a, b metadata.NodeRecord) int { return cmp.Compare(bw[b.ID], bw[a.ID]) })
	}
	return hs
}

// Keys of NodeRecord.Addrs.
const (
	addrGRPC   = "grpc"   // gRPC, the data channel and the tcp transport
	addrGossip = "gossip" // memberlist
	addrShm    = "shm"    // the shm transport's unix socket
	addrHost   = "host"   // the host's identity (api.HostID)
)

// advertised is the address others reach this node's gRPC service and
// data channel at.
func (n *Node) advertised() string {
	if n.cfg.AdvertiseAddr != "" {
		return n.cfg.AdvertiseAddr
	}
	return n.tcpLis.Addr().String()
}

// recordAddrs is what this node publishes of how to reach it.
func (n *Node) recordAddrs(advertise, gossip string) map[string]string {
	a := map[string]string{addrGRPC: advertise, addrGossip: gossip}
	if n.xferLis != nil {
		a[addrShm] = n.cfg.transferSocket()
		a[addrHost] = n.hostID
	}
	return a
}

// transportTo picks how to move bytes to or from peer, and the address
// that transport knows the peer by: its shared memory when the node pulls
// over shm and the peer is on this host, else the configured transport.
func (n *Node) transportTo(peer metadata.NodeRecord) (transfer.Transport, string) {
	if n.shmPull != nil && peer.Addrs[addrShm] != "" && peer.Addrs[addrHost] == n.hostID {
		return n.shmPull, peer.Addrs[addrShm]
	}
	return n.transport, peer.Addrs[addrGRPC]
}

// pull fetches keys[idx...] from one holder.
func (n *Node) pull(ctx context.Context, holder metadata.NodeRecord, tenant, namespace string, keys [][]byte, idx []int, timeout time.Duration) []FetchResult {
	out := make([]FetchResult, len(idx))
	fail := func(err error) []FetchResult {
		for k := range out {
			if out[k].Err == nil && out[k].Source == "" {
				out[k].Err = err
			}
		}
		return out
	}
	addr := holder.Addrs[addrGRPC]
	tr, peer := n.transportTo(holder)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	pc, err := n.peers.get(ctx, addr)
	if err != nil {
		return fail(api.Errorf(api.ErrUnavailable, "pool: reach %s at %s: %v", holder.ID, addr, err))
	}
	// Pin every block on the holder: one pipelined round trip.
	pins, perr := pc.pin(ctx, tenant, namespace, keys, idx)
	if perr != nil {
		pc.close()
		return fail(api.Errorf(api.ErrUnavailable, "pool: pin on %s: %v", holder.ID, perr))
	}
	n.links.Observe(holder.ID, 0, time.Since(start), n.cfg.Now())
	defer pc.release(pins)
	// Reserve local space and read the bytes into it.
	ops := make([]transfer.Op, 0, len(idx))
	res := make([]*Reservation, len(idx))
	opOf := make([]int, len(idx))
	for k, p := range pins {
		opOf[k] = -1
		if p.err != nil {
			out[k].Err = p.err
			continue
		}
		r, err := n.store.Reserve([]byte(tenant), []byte(namespace), keys[idx[k]], int64(p.size), true)
		if err != nil {
			out[k].Err = err
			continue
		}
		res[k] = r
		opOf[k] = len(ops)
		ops = append(ops, transfer.Op{Kind: transfer.Read, Peer: peer, Region: arenaRegion, Offset: p.offset, Local: r.Bytes(), Checksum: true})
	}
	t0 := time.Now()
	batch := tr.Submit(ctx, ops)
	werr := batch.Wait(ctx)
	if ctx.Err() != nil {
		// Some ops may still be writing into reservations: wait for the
		// transport to let go before giving the space back.
		<-batch.Done()
	}
	for k := range idx {
		r := res[k]
		if r == nil {
			continue
		}
		if err := batch.OpErr(opOf[k]); err != nil {
			n.store.Abort(r)
			if ctx.Err() != nil {
				err = fmt.Errorf("%w: no answer from %s within %v", api.ErrUnavailable, holder.ID, timeout)
			}
			out[k].Err = api.Errorf(api.ErrUnavailable, "pool: read from %s: %v", holder.ID, err)
			continue
		}
		// The holder's checksum travelled with the pin; the transport
		// checksummed the bytes as they arrived; the commit compares them.
		cr, err := n.store.Commit(r, batch.OpCRC(opOf[k]), true, pins[k].crc, true)
		if err != nil && !errors.Is(err, api.ErrAlreadyExists) {
			out[k].Err = err
			continue
		}
		_ = cr
		out[k] = FetchResult{Source: holder.ID, Size: int64(pins[k].size)}
		n.metrics.fetched.WithLabelValues(tr.Name()).Add(float64(pins[k].size))
	}
	// The link's estimate is what a fetch delivers: bytes read and
	// committed, usable here, per second after the first response (the
	// cost model plans fetches with it).
	if werr == nil || batch.Bytes() > 0 {
		end := time.Now()
		first, firstBytes := batch.FirstResponse()
		n.links.ObserveRead(holder.ID, int64(batch.Bytes()), t0, first, int64(firstBytes), end)
		n.log.Debug("fetched", "holder", holder.ID, "bytes", batch.Bytes(), "pin", t0.Sub(start),
			"first_response", first.Sub(t0), "read_and_commit", end.Sub(t0))
	}
	return out
}

// peerPin is a block pinned on a peer for a pull.
type peerPin struct {
	offset, size uint64
	crc          uint32
	handle       uint64
	err          error
}

// peerConns keeps data-channel connections to peers for pins, releases,
// reservations and commits: the control plane of transfers.
type peerConns struct {
	mu   sync.Mutex
	idle map[string][]*peerConn
}

type peerConn struct {
	pool *peerConns
	addr string
	c    net.Conn
	br   *bufio.Reader
	buf  []byte
	resp wire.Response
	bad  bool
}

func (p *peerConns) get(ctx context.Context, addr string) (*peerConn, error) {
	p.mu.Lock()
	if l := p.idle[addr]; len(l) > 0 {
		pc := l[len(l)-1]
		p.idle[addr] = l[:len(l)-1]
		p.mu.Unlock()
		return pc, nil
	}
	p.mu.Unlock()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if _, err := c.Write(wire.Preamble[:]); err != nil {
		c.Close()
		return nil, err
	}
	return &peerConn{pool: p, addr: addr, c: c, br: bufio.NewReaderSize(c, 4<<10)}, nil
}

// done returns the connection to the pool, or closes it if it failed.
func (pc *peerConn) done() {
	if pc.bad {
		pc.c.Close()
		return
	}
	pc.pool.mu.Lock()
	defer pc.pool.mu.Unlock()
	if pc.pool.idle == nil {
		pc.pool.idle = map[string][]*peerConn{}
	}
	if len(pc.pool.idle[pc.addr]) >= 8 {
		pc.c.Close()
		return
	}
	pc.pool.idle[pc.addr] = append(pc.pool.idle[pc.addr], pc)
}

func (pc *peerConn) close() {
	pc.bad = true
	pc.c.Close()
}

func (p *peerConns) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.idle {
		for _, pc := range l {
			pc.c.Close()
		}
	}
	p.idle = nil
}

// pin views the blocks on the peer: the pins hold their bytes in place
// until release. The connection's session owns them, so they also end if
// the connection drops.
func (pc *peerConn) pin(ctx context.Context, tenant, namespace string, keys [][]byte, idx []int) ([]peerPin, error) {
	if dl, ok := ctx.Deadline(); ok {
		pc.c.SetDeadline(dl)
	}
	pc.buf = pc.buf[:0]
	for _, i := range idx {
		pc.buf = wire.AppendRequest(pc.buf, &wire.Request{Op: wire.OpView, Tenant: []byte(tenant), Namespace: []byte(namespace), Key: keys[i]})
	}
	if _, err := pc.c.Write(pc.buf); err != nil {
		return nil, err
	}
	pins := make([]peerPin, len(idx))
	for k := range idx {
		if err := wire.ReadResponse(pc.br, &pc.resp); err != nil {
			return nil, err
		}
		if c := codes.Code(pc.resp.Status); c != codes.OK {
			pins[k].err = api.FromCode(c, pc.resp.Message)
			continue
		}
		pins[k] = peerPin{offset: pc.resp.Offset, size: pc.resp.ValueLen, crc: pc.resp.CRC, handle: pc.resp.Handle}
	}
	return pins, nil
}

// release drops the pins (no responses) and returns the connection.
func (pc *peerConn) release(pins []peerPin) {
	pc.buf = pc.buf[:0]
	for _, p := range pins {
		if p.err == nil {
			pc.buf = wire.AppendRequest(pc.buf, &wire.Request{Op: wire.OpRelease, Handle: p.handle})
		}
	}
	pc.c.SetDeadline(time.Now().Add(5 * time.Second))
	if len(pc.buf) > 0 {
		if _, err := pc.c.Write(pc.buf); err != nil {
			pc.bad = true
		}
	}
	pc.c.SetDeadline(time.Time{})
	pc.done()
}

// Fetch implements the KVPoolService RPC.
func (g *grpcService) Fetch(ctx context.Context, req *kvpoolv1.FetchRequest) (*kvpoolv1.FetchResponse, error) {
	res, err := g.n.Fetch(ctx, req.GetTenant(), req.GetNamespace(), req.GetKeys(), time.Duration(req.GetTimeoutMs())*time.Millisecond)
	if err != nil {
		return nil, api.ToStatus(err)
	}
	out := &kvpoolv1.FetchResponse{Results: make([]*kvpoolv1.FetchResult, len(res))}
	for i, r := range res {
		out.Results[i] = &kvpoolv1.FetchResult{SourceNode: r.Source, Status: itemStatus(r.Err), SizeBytes: uint64(r.Size)}
		out.FetchedBytes += uint64(r.Size)
	}
	return out, nil
}

// Route is, for each key, the live nodes that hold it, best measured link
// first, this node first when it holds the key: what a client needs to
// read blocks from their holders itself. A standalone node knows only
// itself.
func (n *Node) Route(tenant, namespace string, keys [][]byte) ([][]metadata.NodeRecord, error) {
	if err := validateChain(tenant, namespace, keys); err != nil {
		return nil, err
	}
	exists, err := n.store.Exists([]byte(tenant), []byte(namespace), keys)
	if err != nil {
		return nil, err
	}
	self := metadata.NodeRecord{ID: n.cfg.NodeID, Addrs: map[string]string{addrGRPC: n.advertised()}}
	now := n.cfg.Now()
	out := make([][]metadata.NodeRecord, len(keys))
	for i, k := range keys {
		var hs []metadata.NodeRecord
		if exists[i] {
			hs = append(hs, self)
		}
		out[i] = append(hs, n.peerHolders(tenant, namespace, k, now)...)
	}
	return out, nil
}

// Route implements the KVPoolService RPC.
func (g *grpcService) Route(ctx context.Context, req *kvpoolv1.RouteRequest) (*kvpoolv1.RouteResponse, error) {
	routes, err := g.n.Route(req.GetTenant(), req.GetNamespace(), req.GetKeys())
	if err != nil {
		return nil, api.ToStatus(err)
	}
	now := g.n.cfg.Now()
	out := &kvpoolv1.RouteResponse{NodeId: g.n.cfg.NodeID, Blocks: make([]*kvpoolv1.BlockRoute, len(routes))}
	for i, hs := range routes {
		br := &kvpoolv1.BlockRoute{}
		for _, h := range hs {
			ph := &kvpoolv1.Holder{NodeId: h.ID, Addr: h.Addrs[addrGRPC]}
			if h.ID != g.n.cfg.NodeID {
				e := g.n.links.Estimate(h.ID, now)
				ph.BytesPerSecond, ph.RttMicros = e.BytesPerSecond, uint64(e.RTT/time.Microsecond)
			}
			br.Holders = append(br.Holders, ph)
		}
		out.Blocks[i] = br
	}
	return out, nil
}

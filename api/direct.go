package api

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"

	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
)

// Holder is a node holding a block, as the connected node sees it.
type Holder struct {
	NodeID string
	// Addr is where the holder's gRPC service and data channel listen.
	Addr string
	// BytesPerSecond and RTTMicros are the connected node's estimate of
	// its link from the holder; 0 for the connected node itself.
	BytesPerSecond float64
	RTTMicros      uint64
}

// Route returns, for each key, the live nodes holding it, best measured
// link first (the connected node first when it holds the key).
func (c *Client) Route(ctx context.Context, tenant, namespace string, keys [][]byte) ([][]Holder, error) {
	resp, err := c.rpc.Route(ctx, &kvpoolv1.RouteRequest{Tenant: tenant, Namespace: namespace, Keys: keys})
	if err != nil {
		return nil, FromStatus(err)
	}
	if len(resp.GetBlocks()) != len(keys) {
		return nil, fmt.Errorf("%w: client: route answered %d blocks for %d keys", ErrUnavailable, len(resp.GetBlocks()), len(keys))
	}
	out := make([][]Holder, len(keys))
	for i, b := range resp.GetBlocks() {
		for _, h := range b.GetHolders() {
			out[i] = append(out[i], Holder{NodeID: h.GetNodeId(), Addr: h.GetAddr(), BytesPerSecond: h.GetBytesPerSecond(), RTTMicros: h.GetRttMicros()})
		}
	}
	return out, nil
}

// DirectResult is one block read by GetDirect.
type DirectResult struct {
	Value []byte
	// Source is the node the bytes came from.
	Source string
	Err    error
}

// directWorkers is how many blocks GetDirect reads from one holder at
// once, each on its own data connection.
const directWorkers = 4

// directDialTimeout bounds reaching a holder: one that takes longer is
// passed over for the next, since a fetch only pays while it beats
// recomputing the block.
const directDialTimeout = time.Second

// GetDirect reads blocks straight from the nodes that hold them (direct
// mode): the connected node answers where each key lives (Route), and the
// client reads each block from its best holder itself, verifying its
// CRC-32C: over the holder's shared memory when it runs on this host and
// its data channel otherwise, unless the client was configured for the
// data channel or gRPC, which it then uses for holders too. A holder that
// cannot be reached, no longer has the block or sends bytes that fail
// their checksum is replaced by the next one (PullFromHolders). Nothing is
// stored on the connected node; Fetch does that. Connections to holders
// are kept for reuse until Close.
//
// The error is for the whole call; per-key outcomes are in the results
// (ErrNotFound when no live node holds a key).
func (c *Client) GetDirect(ctx context.Context, tenant, namespace string, keys [][]byte) ([]DirectResult, error) {
	routes, err := c.Route(ctx, tenant, namespace, keys)
	if err != nil {
		return nil, err
	}
	out := make([]DirectResult, len(keys))
	errs := make([]error, len(keys))
	for i := range keys {
		if len(routes[i]) == 0 {
			errs[i] = fmt.Errorf("%w: client: no live node holds %s/%s/%x", ErrNotFound, tenant, namespace, keys[i])
		}
	}
	PullFromHolders(ctx, routes, errs, func(h Holder) string { return h.Addr }, func(ctx context.Context, h Holder, items []int) []error {
		got := make([]error, len(items))
		hc, derr := c.holderClient(ctx, h)
		if derr != nil {
			for j := range got {
				got[j] = derr
			}
			return got
		}
		work := make(chan int, len(items))
		for j := range items {
			work <- j
		}
		close(work)
		var unreachable atomic.Bool
		var wg sync.WaitGroup
		for range min(directWorkers, len(items)) {
			wg.Go(func() {
				for j := range work {
					i := items[j]
					v, err := hc.GetValue(ctx, BlockKey{Tenant: tenant, Namespace: namespace, Key: keys[i]})
					out[i], got[j] = DirectResult{Value: v, Source: h.NodeID}, err
					if Code(err) == codes.Unavailable {
						unreachable.Store(true)
					}
				}
			})
		}
		wg.Wait()
		if unreachable.Load() && hc != c {
			// Calls still using it fail over to other holders.
			c.holders.drop(h.Addr, hc)
		}
		return got
	})
	for i := range out {
		out[i].Err = errs[i]
		if errs[i] != nil {
			out[i].Value = nil
		}
	}
	return out, nil
}

// holderClient returns a client of the node h, the connected one itself
// when h is it.
func (c *Client) holderClient(ctx context.Context, h Holder) (*Client, error) {
	if h.NodeID == c.info.GetNodeId() || h.Addr == c.cfg.Server {
		return c, nil
	}
	return c.holders.get(h.Addr, func() (*Client, error) {
		path := PathAuto // the holder's shared memory if it is on this host
		if c.cfg.Path == PathData || c.cfg.Path == PathGRPC {
			path = c.cfg.Path
		}
		hc, err := Dial(ctx, ClientConfig{Server: h.Addr, Path: path, MaxIdleConns: directWorkers, DialTimeout: min(c.cfg.DialTimeout, directDialTimeout),
			VerifySharedReads: true, Logger: c.cfg.Logger, DialOptions: c.cfg.DialOptions, TLS: c.cfg.TLS, Token: c.cfg.Token})
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("%w: client: holder %s at %s: %v", ErrUnavailable, h.NodeID, h.Addr, err)
		}
		return hc, nil
	})
}

// holderClients are the clients of other nodes GetDirect reads from, by
// address (a sync.Map of *Client). Safe for concurrent use.
type holderClients struct{ m sync.Map }

// get returns the client for addr, dialing one with dial when there is
// none.
func (hc *holderClients) get(addr string, dial func() (*Client, error)) (*Client, error) {
	if c, ok := hc.m.Load(addr); ok {
		return c.(*Client), nil
	}
	c, err := dial()
	if err != nil {
		return nil, err
	}
	if old, loaded := hc.m.LoadOrStore(addr, c); loaded {
		c.Close()
		return old.(*Client), nil
	}
	return c, nil
}

// drop forgets and closes a holder's client after it failed, so the next
// call dials afresh; a client another call dropped already is left alone.
func (hc *holderClients) drop(addr string, c *Client) {
	if hc.m.CompareAndDelete(addr, c) {
		c.Close()
	}
}

// closeAll closes every holder client.
func (hc *holderClients) closeAll() error {
	var errs []error
	hc.m.Range(func(addr, c any) bool {
		hc.m.Delete(addr)
		errs = append(errs, c.(*Client).Close())
		return true
	})
	return errors.Join(errs...)
}

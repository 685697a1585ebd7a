package api

import (
	"context"
	"errors"
	"fmt"
	"sync"
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
// data channel or gRPC, which it then uses for holders too. A holder that cannot be reached, no
// longer has the block or sends bytes that fail their checksum is replaced
// by the next one. Nothing is stored on the connected node; Fetch does
// that. Connections to holders are kept for reuse until Close.
//
// The error is for the whole call; per-key outcomes are in the results
// (ErrNotFound when no live node holds a key).
func (c *Client) GetDirect(ctx context.Context, tenant, namespace string, keys [][]byte) ([]DirectResult, error) {
	routes, err := c.Route(ctx, tenant, namespace, keys)
	if err != nil {
		return nil, err
	}
	out := make([]DirectResult, len(keys))
	type want struct {
		i     int
		tried int
	}
	var missing []*want
	for i := range keys {
		if len(routes[i]) == 0 {
			out[i].Err = fmt.Errorf("%w: client: no live node holds %s/%s/%x", ErrNotFound, tenant, namespace, keys[i])
			continue
		}
		missing = append(missing, &want{i: i})
	}
	for len(missing) > 0 && ctx.Err() == nil {
		groups := map[string][]*want{}
		var order []string
		for _, w := range missing {
			addr := routes[w.i][w.tried].Addr
			if _, ok := groups[addr]; !ok {
				order = append(order, addr)
			}
			groups[addr] = append(groups[addr], w)
		}
		missing = missing[:0]
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, addr := range order {
			group := groups[addr]
			wg.Go(func() {
				src := routes[group[0].i][group[0].tried]
				hc, derr := c.holderClient(ctx, src)
				var next sync.Mutex
				k := 0
				unreachable := false // under mu
				var inner sync.WaitGroup
				for range min(directWorkers, len(group)) {
					inner.Go(func() {
						for {
							next.Lock()
							if k == len(group) {
								next.Unlock()
								return
							}
							w := group[k]
							k++
							next.Unlock()
							err := derr
							var v []byte
							if err == nil {
								v, err = hc.GetValue(ctx, BlockKey{Tenant: tenant, Namespace: namespace, Key: keys[w.i]})
							}
							mu.Lock()
							out[w.i] = DirectResult{Value: v, Source: src.NodeID, Err: err}
							if Code(err) == codes.Unavailable {
								unreachable = true
							}
							if err != nil && retryElsewhere(err) && w.tried+1 < len(routes[w.i]) && ctx.Err() == nil {
								w.tried++
								missing = append(missing, w)
							}
							mu.Unlock()
						}
					})
				}
				inner.Wait()
				mu.Lock()
				drop := derr == nil && hc != c && unreachable
				mu.Unlock()
				if drop {
					// Calls still using it fail over to other holders.
					c.dropHolder(src.Addr, hc)
				}
			})
		}
		wg.Wait()
	}
	return out, nil
}

// retryElsewhere reports whether another holder may succeed where one
// failed with err.
func retryElsewhere(err error) bool {
	switch Code(err) {
	case codes.Unavailable, codes.NotFound, codes.DataLoss, codes.DeadlineExceeded, codes.Aborted:
		return true
	}
	return false
}

// holderClient returns a client of the node h, the connected one itself
// when h is it.
func (c *Client) holderClient(ctx context.Context, h Holder) (*Client, error) {
	if h.NodeID == c.info.GetNodeId() || h.Addr == c.cfg.Server {
		return c, nil
	}
	c.hmu.Lock()
	if hc, ok := c.holders[h.Addr]; ok {
		c.hmu.Unlock()
		return hc, nil
	}
	c.hmu.Unlock()
	path := PathAuto // the holder's shared memory if it is on this host
	if c.cfg.Path == PathData || c.cfg.Path == PathGRPC {
		path = c.cfg.Path
	}
	hc, err := Dial(ctx, ClientConfig{Server: h.Addr, Path: path, MaxIdleConns: directWorkers, DialTimeout: min(c.cfg.DialTimeout, directDialTimeout),
		VerifySharedReads: true, Logger: c.cfg.Logger, DialOptions: c.cfg.DialOptions})
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w: client: holder %s at %s: %v", ErrUnavailable, h.NodeID, h.Addr, err)
	}
	c.hmu.Lock()
	defer c.hmu.Unlock()
	if c.holders == nil {
		c.holders = map[string]*Client{}
	}
	if old, ok := c.holders[h.Addr]; ok {
		hc.Close()
		return old, nil
	}
	c.holders[h.Addr] = hc
	return hc, nil
}

// dropHolder forgets a holder's client after it failed, so the next call
// dials afresh.
func (c *Client) dropHolder(addr string, hc *Client) {
	c.hmu.Lock()
	if c.holders[addr] == hc {
		delete(c.holders, addr)
	} else {
		hc = nil
	}
	c.hmu.Unlock()
	if hc != nil {
		hc.Close()
	}
}

// closeHolders closes every holder client.
func (c *Client) closeHolders() error {
	c.hmu.Lock()
	hs := c.holders
	c.holders = nil
	c.hmu.Unlock()
	var errs []error
	for _, hc := range hs {
		errs = append(errs, hc.Close())
	}
	return errors.Join(errs...)
}

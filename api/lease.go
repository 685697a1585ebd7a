package api

import (
	"context"
	"time"

	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
)

// LocateLease is Locate that also takes a read lease of d on the prefix
// the node holds: until it ends those blocks are not evicted and Remove
// fails unless forced. d ≤ 0 takes the node's default (10 s unless
// configured); the node caps d at its maximum. It returns the prefix
// length and when the lease ends.
func (c *Client) LocateLease(ctx context.Context, tenant, namespace string, chain [][]byte, d time.Duration) (int, time.Time, error) {
	resp, err := c.rpc.Locate(ctx, &kvpoolv1.LocateRequest{Tenant: tenant, Namespace: namespace, Keys: chain, LeaseMs: leaseMs(d), Lease: true})
	if err != nil {
		return 0, time.Time{}, FromStatus(err)
	}
	var until time.Time
	if ms := resp.GetLeaseUntilUnixMs(); ms > 0 {
		until = time.UnixMilli(ms)
	}
	return int(resp.GetPrefixBlocks()), until, nil
}

// GetLease is Get over gRPC that also takes a read lease of d on the
// block (d ≤ 0: the node's default). It returns the block's bytes.
func (c *Client) GetLease(ctx context.Context, k BlockKey, d time.Duration) ([]byte, error) {
	if err := k.Validate(); err != nil {
		return nil, err
	}
	return c.getGRPCLease(ctx, k, nil, true, leaseMs(d), true)
}

// RemoveForce removes a block even under a read lease.
func (c *Client) RemoveForce(ctx context.Context, k BlockKey) error {
	if err := k.Validate(); err != nil {
		return err
	}
	_, err := c.rpc.Remove(ctx, &kvpoolv1.RemoveRequest{Key: &kvpoolv1.BlockKey{Tenant: k.Tenant, Namespace: k.Namespace, Key: k.Key}, Force: true})
	return FromStatus(err)
}

func leaseMs(d time.Duration) uint32 {
	if d <= 0 {
		return 0
	}
	return uint32(min(d.Milliseconds(), 1<<31))
}

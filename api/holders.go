package api

import (
	"context"
	"sync"

	"google.golang.org/grpc/codes"
)

// PullFromHolders reads items from the nodes that hold them, failing over
// from one holder to the next: the loop behind a node's Fetch (pool) and a
// client's GetDirect. holders[i] lists item i's holders, best first; key
// names a holder (items whose next holder has the same key go together).
//
// In each round the items still wanted are grouped by their next untried
// holder, and pull runs once per group, every group at once; pull returns
// one error per item of its group (nil: done). An item whose error
// Retryable accepts moves on to its next holder for the following round,
// while it has one and ctx lives. errs[i] ends up holding item i's last
// error; items with no holders are skipped, and their errs entries left as
// the caller set them. pull may write results for its items into the
// caller's own slices by index: no two calls ever hold the same item.
func PullFromHolders[H any](ctx context.Context, holders [][]H, errs []error, key func(H) string,
	pull func(ctx context.Context, h H, items []int) []error) {
	tried := make([]int, len(holders))
	var wanted []int
	for i, hs := range holders {
		if len(hs) > 0 {
			wanted = append(wanted, i)
		}
	}
	for len(wanted) > 0 && ctx.Err() == nil {
		groups := map[string][]int{}
		var order []string
		for _, i := range wanted {
			k := key(holders[i][tried[i]])
			if _, ok := groups[k]; !ok {
				order = append(order, k)
			}
			groups[k] = append(groups[k], i)
		}
		wanted = wanted[:0]
		var mu sync.Mutex
		var wg sync.WaitGroup
		for g, k := range order {
			items := groups[k]
			pullGroup := func() {
				got := pull(ctx, holders[items[0]][tried[items[0]]], items)
				mu.Lock()
				defer mu.Unlock()
				for j, i := range items {
					errs[i] = got[j]
					if got[j] != nil && Retryable(got[j]) && tried[i]+1 < len(holders[i]) && ctx.Err() == nil {
						tried[i]++
						wanted = append(wanted, i)
					}
				}
			}
			// The last group is pulled by the caller: a chain that one
			// holder serves, the common case, starts no goroutine and
			// wakes nobody when it is done.
			if g == len(order)-1 {
				pullGroup()
			} else {
				wg.Go(pullGroup)
			}
		}
		wg.Wait()
	}
}

// Retryable reports whether another holder may succeed where one failed
// with err: it was unreachable or slow, no longer had the block, or sent
// bytes that failed their checksum.
func Retryable(err error) bool {
	switch Code(err) {
	case codes.Unavailable, codes.NotFound, codes.DataLoss, codes.DeadlineExceeded, codes.Aborted:
		return true
	}
	return false
}

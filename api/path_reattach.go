package api

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
	"github.com/kvpool/kvpool/api/wire"
)

// reattachingShm is the shared-memory path of a client that outlives its
// node's restarts: when the session breaks (the node stopped, or was
// killed), the next call attaches again (a new session, the segment
// mapped anew: a node restarted with a data directory serves the same
// blocks from it) and a call that found the session broken is retried
// once where that is safe: reads, and puts (blocks are immutable: a put
// that had committed before the break commits again as Existed). A
// removal is not retried: its keys may be gone already.
//
// The old mapping stays until the views taken from it are closed, then
// is unmapped. Attempts are spaced by reattachBackoff while the node is
// down, so a client of a dead node fails fast with ErrUnavailable.
type reattachingShm struct {
	info *kvpoolv1.InfoResponse
	cfg  ClientConfig
	wc   wire.ConnConfig

	mu      sync.Mutex
	cur     *shmPath
	lastTry time.Time
	retired []*shmPath // replaced paths with views still open
	closed  bool
	// reattached counts sessions attached after the first.
	reattached atomic.Int64
	// behindErrs are the write-behind failures of sessions replaced since
	// the last flushBehind (their commits in flight when they broke).
	behindErrs []error
}

// reattachBackoff spaces attempts to attach while the node is down.
const reattachBackoff = 100 * time.Millisecond

func newReattachingShm(s *shmPath, info *kvpoolv1.InfoResponse, cfg ClientConfig, wc wire.ConnConfig) *reattachingShm {
	r := &reattachingShm{info: info, cfg: cfg, wc: wc, cur: s}
	s.viewClosed = r.viewClosed
	return r
}

// path returns the session to use: the current one, or a new one when it
// broke (and an attempt is due, or force).
func (r *reattachingShm) path(ctx context.Context, force bool) *shmPath {
	r.mu.Lock()
	defer r.mu.Unlock()
	cur := r.cur
	if r.closed || !cur.isBroken() || (!force && time.Since(r.lastTry) < reattachBackoff) {
		return cur
	}
	r.lastTry = time.Now()
	s, err := attachShm(ctx, r.info, r.cfg, r.wc)
	if err != nil {
		return cur // still down: cur fails with its error
	}
	s.viewClosed = r.viewClosed
	if err := cur.flushBehind(ctx); err != nil {
		r.behindErrs = append(r.behindErrs, err)
	}
	r.cur = s
	r.reattached.Add(1)
	r.retired = append(r.retired, cur)
	r.closeIdleLocked()
	return s
}

// closeIdleLocked unmaps the retired paths without open views.
// REQUIRES: r.mu.
func (r *reattachingShm) closeIdleLocked() {
	keep := r.retired[:0]
	for _, s := range r.retired {
		if s.views.Load() > 0 {
			keep = append(keep, s)
			continue
		}
		s.close()
	}
	r.retired = keep
}

// retry runs op on the current session, and once more on a new one when
// the session broke under it.
func retry[T any](ctx context.Context, r *reattachingShm, op func(s *shmPath) (T, error)) (T, error) {
	s := r.path(ctx, false)
	out, err := op(s)
	if err == nil || !errors.Is(err, ErrUnavailable) || !s.isBroken() {
		return out, err
	}
	if s2 := r.path(ctx, true); s2 != s {
		return op(s2)
	}
	return out, err
}

func (r *reattachingShm) put(ctx context.Context, k BlockKey, value []byte, copies uint32) (PutResult, error) {
	return retry(ctx, r, func(s *shmPath) (PutResult, error) { return s.put(ctx, k, value, copies) })
}

func (r *reattachingShm) putMany(ctx context.Context, tenant, namespace string, keys, values [][]byte) ([]error, error) {
	return retry(ctx, r, func(s *shmPath) ([]error, error) { return s.putMany(ctx, tenant, namespace, keys, values) })
}

// putBehind is shmPath.putBehind, retried on a new session when the
// session broke before the commit was posted (the value is still the
// caller's then).
func (r *reattachingShm) putBehind(ctx context.Context, k BlockKey, value []byte) error {
	_, err := retry(ctx, r, func(s *shmPath) (struct{}, error) { return struct{}{}, s.putBehind(ctx, k, value) })
	return err
}

// flushBehind is shmPath.flushBehind, with the failures of the sessions
// it replaced.
func (r *reattachingShm) flushBehind(ctx context.Context) error {
	cur := r.path(ctx, false)
	r.mu.Lock()
	errs := r.behindErrs
	r.behindErrs = nil
	r.mu.Unlock()
	return errors.Join(errors.Join(errs...), cur.flushBehind(ctx))
}

func (r *reattachingShm) get(ctx context.Context, k BlockKey, dst []byte, l lease) ([]byte, error) {
	return retry(ctx, r, func(s *shmPath) ([]byte, error) { return s.get(ctx, k, dst, l) })
}

func (r *reattachingShm) view(ctx context.Context, k BlockKey, l lease) (*View, error) {
	return retry(ctx, r, func(s *shmPath) (*View, error) { return s.view(ctx, k, l) })
}

func (r *reattachingShm) reserve(ctx context.Context, k BlockKey, size int) (*Reservation, error) {
	return retry(ctx, r, func(s *shmPath) (*Reservation, error) { return s.reserve(ctx, k, size) })
}

func (r *reattachingShm) remove(ctx context.Context, tenant, namespace string, keys [][]byte, force bool) ([]error, error) {
	return r.path(ctx, false).remove(ctx, tenant, namespace, keys, force)
}

// viewClosed hears that a path's last open view closed: a retired path
// is unmapped then.
func (r *reattachingShm) viewClosed() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.retired) > 0 {
		r.closeIdleLocked()
	}
}

func (r *reattachingShm) close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	err := r.cur.close()
	for _, s := range r.retired {
		err = errors.Join(err, s.close())
	}
	r.retired = nil
	return err
}

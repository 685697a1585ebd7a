// Package engines follows the inference engines' own KV caches: it
// subscribes to each engine's KV events (vLLM's ZeroMQ stream), keeps each
// engine's GPU prefix cache in a kvevents.Engine index, fills sequence
// gaps from the engine's replay socket, and answers how much of a chain
// the engines hold.
//
// A Tracker's Run owns one goroutine per engine; they stop when its
// context ends. Prefix and Stats are safe to call concurrently with Run.
package engines

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvpool/kvpool/metadata/kvevents"
)

// EngineConfig is one engine's event stream.
type EngineConfig struct {
	// Name identifies the engine in stats and logs. Required.
	Name string
	// Endpoint is the engine's PUB socket ("tcp://127.0.0.1:5557", vLLM's
	// kv_events_config.endpoint seen from here). Required.
	Endpoint string
	// Replay is its ROUTER replay socket (replay_endpoint); "" when it has
	// none, and then a gap is a loss.
	Replay string
	// Topic filters messages by topic prefix; "" takes all.
	Topic string
	// Keying says how the engine's blocks become kvpool keys.
	Keying kvevents.Keying
	// Tenant and Namespace are whose blocks the engine computes: its GPU
	// cache counts only for plans of that tenant and namespace, as the
	// host tier's blocks do. Empty matches any (an engine serving everyone,
	// on a node that does not separate tenants).
	Tenant, Namespace string
}

// Config is a Tracker's.
type Config struct {
	Engines []EngineConfig
	// ReplayTimeout bounds one replay request. Default 1 s.
	ReplayTimeout time.Duration
	// RetryInterval is how long to wait before reconnecting a stream that
	// failed. Default 500 ms.
	RetryInterval time.Duration
	// Logger receives problems. Default: discard.
	Logger *slog.Logger
	// Now is the clock; default time.Now.
	Now func() time.Time
	// WatchBuffer is how many updates a watcher may fall behind before
	// its Watch ends with ErrWatcherBehind. Default 4096.
	WatchBuffer int
}

// Validate reports every problem with c.
func (c *Config) Validate() error {
	var errs []error
	names := map[string]bool{}
	for i, e := range c.Engines {
		if e.Name == "" || names[e.Name] {
			errs = append(errs, fmt.Errorf("engine %d: name %q is empty or repeated", i, e.Name))
		}
		names[e.Name] = true
		endpoints := []string{e.Endpoint}
		if e.Replay != "" {
			endpoints = append(endpoints, e.Replay)
		}
		for _, ep := range endpoints {
			if !strings.HasPrefix(ep, "tcp://") && !strings.HasPrefix(ep, "ipc://") {
				errs = append(errs, fmt.Errorf("engine %s: endpoint %q: want tcp://host:port or ipc://path", e.Name, ep))
			}
		}
	}
	if c.ReplayTimeout < 0 || c.RetryInterval < 0 || c.WatchBuffer < 0 {
		errs = append(errs, errors.New("replay timeout, retry interval and watch buffer must not be negative"))
	}
	return errors.Join(errs...)
}

func (c *Config) fill() {
	if c.ReplayTimeout == 0 {
		c.ReplayTimeout = time.Second
	}
	if c.RetryInterval == 0 {
		c.RetryInterval = 500 * time.Millisecond
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.WatchBuffer == 0 {
		c.WatchBuffer = 4096
	}
}

// Tracker follows a set of engines.
type Tracker struct {
	cfg     Config
	engines []*engine
}

type engine struct {
	cfg EngineConfig

	mu        sync.Mutex
	idx       *kvevents.Engine
	malformed int64
	replays   int64
	lastAt    time.Time
	lagS      float64 // now − the last batch's ts when it was applied
	connected bool
	// watchers receive the index's changes; each is sent them under mu,
	// so every watcher sees them in the index's order.
	watchers map[*watcher]struct{}
}

// watcher is one Watch call's queue.
type watcher struct {
	updates chan Update
	behind  chan struct{} // closed when updates overflowed
}

// Update is a change to one engine's GPU-resident kvpool keys, as Watch
// delivers it. Tenant and Namespace are the engine's scope
// (EngineConfig).
type Update struct {
	Engine, Tenant, Namespace string
	kvevents.Changes
}

// ErrWatcherBehind ends a Watch whose caller fell WatchBuffer updates
// behind: watching again starts from a fresh snapshot.
var ErrWatcherBehind = errors.New("engines: the watcher fell behind")

// publish sends the index's changes to every watcher. Called with e.mu
// held, after every change to e.idx.
func (e *engine) publish() {
	c := e.idx.TakeChanges()
	if c.Empty() {
		return
	}
	u := Update{Engine: e.cfg.Name, Tenant: e.cfg.Tenant, Namespace: e.cfg.Namespace, Changes: c}
	for w := range e.watchers {
		select {
		case w.updates <- u:
		default:
			close(w.behind)
			delete(e.watchers, w)
		}
	}
}

// Watch calls fn with a snapshot of every engine's keys (one Reset update
// per engine, in config order), then with each change as it is applied,
// in order per engine, until ctx ends, fn returns an error or the caller
// falls behind (ErrWatcherBehind). fn runs on Watch's goroutine and must
// not keep the update's slices.
func (t *Tracker) Watch(ctx context.Context, fn func(Update) error) error {
	w := &watcher{updates: make(chan Update, t.cfg.WatchBuffer), behind: make(chan struct{})}
	var snapshot []Update
	for _, e := range t.engines {
		e.mu.Lock()
		e.publish() // what is pending predates the snapshot
		u := Update{Engine: e.cfg.Name, Tenant: e.cfg.Tenant, Namespace: e.cfg.Namespace, Changes: kvevents.Changes{Reset: true}}
		for _, k := range e.idx.Keys() {
			u.Keys = append(u.Keys, kvevents.KeyChange{Key: k, Held: true})
		}
		e.watchers[w] = struct{}{}
		e.mu.Unlock()
		snapshot = append(snapshot, u)
	}
	defer func() {
		for _, e := range t.engines {
			e.mu.Lock()
			delete(e.watchers, w)
			e.mu.Unlock()
		}
	}()
	for _, u := range snapshot {
		if err := fn(u); err != nil {
			return err
		}
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-w.behind:
			return ErrWatcherBehind
		case u := <-w.updates:
			if err := fn(u); err != nil {
				return err
			}
		}
	}
}

// New returns a Tracker that knows nothing yet; Run starts following.
func New(cfg Config) (*Tracker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("engines: %w", err)
	}
	cfg.fill()
	t := &Tracker{cfg: cfg}
	for _, e := range cfg.Engines {
		idx := kvevents.NewEngine(e.Keying)
		idx.TrackChanges()
		t.engines = append(t.engines, &engine{cfg: e, idx: idx, watchers: map[*watcher]struct{}{}})
	}
	return t, nil
}

// Prefix is the longest run of leading keys of chain that one engine of
// tenant and namespace holds in GPU memory.
func (t *Tracker) Prefix(tenant, namespace string, chain [][]byte) int {
	best := 0
	for _, e := range t.engines {
		if (e.cfg.Tenant != "" && e.cfg.Tenant != tenant) || (e.cfg.Namespace != "" && e.cfg.Namespace != namespace) {
			continue
		}
		e.mu.Lock()
		best = max(best, e.idx.Prefix(chain))
		e.mu.Unlock()
	}
	return best
}

// Stats is one engine's.
type Stats struct {
	Name      string
	Connected bool
	Held      int
	kvevents.EngineStats
	// Malformed counts messages that did not decode (skipped); Replays the
	// replay requests made.
	Malformed, Replays int64
	// LastEvent is when the last message was applied; LagSeconds how far
	// behind the engine's clock it was then.
	LastEvent  time.Time
	LagSeconds float64
}

// Stats reports every engine's.
func (t *Tracker) Stats() []Stats {
	out := make([]Stats, 0, len(t.engines))
	for _, e := range t.engines {
		e.mu.Lock()
		out = append(out, Stats{Name: e.cfg.Name, Connected: e.connected, Held: e.idx.Len(), EngineStats: e.idx.Stats,
			Malformed: e.malformed, Replays: e.replays, LastEvent: e.lastAt, LagSeconds: e.lagS})
		e.mu.Unlock()
	}
	return out
}

// Engines is how many engines t follows.
func (t *Tracker) Engines() int { return len(t.engines) }

// Run follows every engine until ctx ends.
func (t *Tracker) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, e := range t.engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.follow(ctx, e)
		}()
	}
	wg.Wait()
	return nil
}

// follow subscribes to one engine, reconnecting after failures.
func (t *Tracker) follow(ctx context.Context, e *engine) {
	for ctx.Err() == nil {
		err := t.stream(ctx, e)
		e.mu.Lock()
		e.connected = false
		e.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		t.cfg.Logger.Warn("engines: event stream failed; reconnecting", "engine", e.cfg.Name, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(t.cfg.RetryInterval):
		}
	}
}

func (t *Tracker) stream(ctx context.Context, e *engine) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sub := zmq4.NewSub(sctx, zmq4.WithDialerRetry(t.cfg.RetryInterval), zmq4.WithAutomaticReconnect(true))
	defer sub.Close()
	if err := sub.SetOption(zmq4.OptionSubscribe, e.cfg.Topic); err != nil {
		return err
	}
	if err := sub.Dial(e.cfg.Endpoint); err != nil {
		return err
	}
	e.mu.Lock()
	e.connected = true
	e.mu.Unlock()
	for {
		msg, err := sub.Recv()
		if err != nil {
			return err
		}
		m, err := kvevents.DecodeMessage(msg.Frames)
		if err != nil {
			e.mu.Lock()
			e.malformed++
			e.mu.Unlock()
			t.cfg.Logger.Debug("engines: skipped a malformed message", "engine", e.cfg.Name, "err", err)
			continue
		}
		e.mu.Lock()
		v := e.idx.Apply(m)
		next := e.idx.Next()
		e.publish()
		e.mu.Unlock()
		if v == kvevents.Gap {
			t.fill(ctx, e, next, m)
		}
		t.applied(e, &m)
	}
}

func (t *Tracker) applied(e *engine, m *kvevents.Message) {
	now := t.cfg.Now()
	e.mu.Lock()
	e.lastAt = now
	if m.Batch.TS > 0 {
		e.lagS = float64(now.UnixNano())/1e9 - m.Batch.TS
	}
	e.mu.Unlock()
}

// endSeq is the replay's end marker: −1 as an 8-byte big-endian signed
// integer.
var endSeq = [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// fill asks the engine's replay socket for messages from `from` on,
// applies them, then the message that revealed the gap; what the replay
// cannot cover is lost.
func (t *Tracker) fill(ctx context.Context, e *engine, from uint64, gapMsg kvevents.Message) {
	if e.cfg.Replay != "" {
		if err := t.replay(ctx, e, from, gapMsg.Seq); err != nil {
			t.cfg.Logger.Warn("engines: replay failed", "engine", e.cfg.Name, "from", from, "err", err)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.idx.Next() < gapMsg.Seq {
		e.idx.Lost(gapMsg.Seq)
	}
	e.idx.Apply(gapMsg)
	e.publish()
}

func (t *Tracker) replay(ctx context.Context, e *engine, from, until uint64) error {
	rctx, cancel := context.WithTimeout(ctx, t.cfg.ReplayTimeout)
	defer cancel()
	d := zmq4.NewDealer(rctx, zmq4.WithDialerTimeout(t.cfg.ReplayTimeout))
	defer d.Close()
	if err := d.Dial(e.cfg.Replay); err != nil {
		return err
	}
	e.mu.Lock()
	e.replays++
	e.mu.Unlock()
	if err := d.Send(zmq4.NewMsgFrom([]byte{}, binary.BigEndian.AppendUint64(nil, from))); err != nil {
		return err
	}
	for {
		msg, err := d.Recv()
		if err != nil {
			return err
		}
		frames := msg.Frames
		if len(frames) > 0 && len(frames[0]) == 0 {
			frames = frames[1:] // the delimiter ROUTER sent back
		}
		if len(frames) != 2 || len(frames[0]) != 8 {
			return fmt.Errorf("a replay reply of %d frames", len(frames))
		}
		if [8]byte(frames[0]) == endSeq {
			return nil
		}
		m, err := kvevents.DecodeMessage([][]byte{[]byte(e.cfg.Topic), frames[0], frames[1]})
		if err != nil {
			e.mu.Lock()
			e.malformed++
			e.mu.Unlock()
			continue
		}
		if m.Seq >= until {
			continue // the live stream has it
		}
		e.mu.Lock()
		if e.idx.Apply(m) == kvevents.Gap {
			// The buffer no longer reaches back to `from`.
			e.idx.Lost(m.Seq)
			e.idx.Apply(m)
		}
		e.publish()
		e.mu.Unlock()
	}
}

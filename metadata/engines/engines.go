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
	if c.ReplayTimeout < 0 || c.RetryInterval < 0 {
		errs = append(errs, errors.New("replay timeout and retry interval must not be negative"))
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
}

// New returns a Tracker that knows nothing yet; Run starts following.
func New(cfg Config) (*Tracker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("engines: %w", err)
	}
	cfg.fill()
	t := &Tracker{cfg: cfg}
	for _, e := range cfg.Engines {
		t.engines = append(t.engines, &engine{cfg: e, idx: kvevents.NewEngine(e.Keying)})
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
		e.mu.Unlock()
	}
}

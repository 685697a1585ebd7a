package metadata

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Load is what a node gossips about itself: its free space, and the queue
// time and prefill speed its local engine reported (ReportLoad).
type Load struct {
	CapacityBytes int64 `json:"cap"`
	UsedBytes     int64 `json:"used"`
	Blocks        int64 `json:"blocks"`
	// QueueSeconds is how long a new request would wait in the engine.
	QueueSeconds float64 `json:"queue_s"`
	// PrefillTokensPerSecond is the engine's current prefill speed.
	PrefillTokensPerSecond float64 `json:"prefill_tps"`
	// PrefillPromptTokens is the prompt length that speed was measured
	// at, 0 if the engine did not say; the cost model scales the node's
	// prefill curve so it passes through (tokens, speed).
	PrefillPromptTokens int64 `json:"prefill_tokens,omitempty"`
	// Model is the model profile the engine serves, as it reported it.
	Model string `json:"model,omitempty"`
	// EngineReportUnix is when the engine last reported, 0 if never, and
	// EngineReportUnixMilli the same in milliseconds.
	EngineReportUnix      int64 `json:"engine_at,omitempty"`
	EngineReportUnixMilli int64 `json:"engine_at_ms,omitempty"`
}

// FreeBytes is capacity minus used.
func (l Load) FreeBytes() int64 { return l.CapacityBytes - l.UsedBytes }

// Peer is a node as gossip sees it.
type Peer struct {
	ID    string
	Addr  string
	State string // "alive" or "dead"; a node that left is dead
	Load  Load
}

// GossipConfig configures failure detection and load dissemination.
type GossipConfig struct {
	// NodeID is this node's name in gossip. Required.
	NodeID string
	// BindAddr is host:port for gossip (UDP and TCP); port 0 picks one.
	// Default 127.0.0.1:0.
	BindAddr string
	// ProbeInterval is how often a random peer is probed. A dead peer is
	// declared after about ProbeInterval × (2 + SuspicionMult·log10(N+1)).
	// Default 200 ms.
	ProbeInterval time.Duration
	// Seeds returns addresses to join; it is called every ProbeInterval
	// from Run's goroutine, and the ones not alive in gossip are joined (a
	// dead one at most every 10 s). Typically the gossip addresses of the
	// node records in etcd. Default nil: join nobody.
	Seeds func() []string
	// Load returns this node's load to gossip; called every second and
	// after Refresh.
	Load func() Load
	// Logger receives gossip's logs, memberlist's own included, at the
	// level memberlist tags each line with. It should already carry the
	// node's id; gossip adds its own name ("component"="gossip"). Default:
	// discard.
	Logger *slog.Logger
}

// Gossip runs memberlist among daemons: fast failure detection (well under
// an etcd lease TTL) and the dissemination of every node's Load.
type Gossip struct {
	cfg   GossipConfig
	log   *slog.Logger
	ml    *memberlist.Memberlist
	mlLog *memberlistLog // memberlist's log lines, dropped after Shutdown
	meta  chan struct{}
	addr  string
	// crashed is set by Crash (tests), which stopped memberlist without a
	// goodbye: Shutdown must not leave.
	crashed atomic.Bool
	stop    sync.Once

	// mu guards what the event callbacks copy out of memberlist: its
	// Node structs change under it, so they are never read elsewhere.
	mu    sync.Mutex
	peers map[string]*peerCopy // by node id, this node included
	load  []byte               // our encoded Load

	lastTry map[string]time.Time // join attempts by address; Run's goroutine only
}

// NewGossip binds the gossip port and starts memberlist on it: from then
// on the node answers probes and accepts joins. Run joins the seeds and
// publishes the load, and leaves when it returns. The caller MUST call
// Run or Shutdown, which stop memberlist.
func NewGossip(cfg GossipConfig) (*Gossip, error) {
	if cfg.NodeID == "" {
		return nil, errors.New("metadata: gossip needs a node id")
	}
	if cfg.BindAddr == "" {
		cfg.BindAddr = "127.0.0.1:0"
	}
	if cfg.ProbeInterval == 0 {
		cfg.ProbeInterval = 200 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	host, portStr, err := net.SplitHostPort(cfg.BindAddr)
	if err != nil {
		return nil, fmt.Errorf("metadata: gossip address %q: %w", cfg.BindAddr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("metadata: gossip port %q: %w", portStr, err)
	}
	if port == 0 {
		// memberlist needs the same port for UDP and TCP: find one free for
		// both.
		if port, err = freeUDPTCPPort(host); err != nil {
			return nil, err
		}
	}
	g := &Gossip{cfg: cfg, log: cfg.Logger.With("component", "gossip"), peers: map[string]*peerCopy{}, meta: make(chan struct{}, 1), lastTry: map[string]time.Time{},
		addr: net.JoinHostPort(host, strconv.Itoa(port))}
	mc := memberlist.DefaultLANConfig()
	mc.Name = cfg.NodeID
	mc.BindAddr, mc.BindPort = host, port
	mc.AdvertiseAddr, mc.AdvertisePort = host, port
	mc.ProbeInterval = cfg.ProbeInterval
	mc.ProbeTimeout = cfg.ProbeInterval / 2
	mc.SuspicionMult = 2
	mc.GossipInterval = cfg.ProbeInterval / 2
	mc.PushPullInterval = 10 * cfg.ProbeInterval
	mc.TCPTimeout = 2 * time.Second
	// A node that died and came back under the same id on another port
	// (a restart picks a free one) may take over its dead entry this soon;
	// memberlist's default, never, kept it dead to its peers.
	mc.DeadNodeReclaimTime = cfg.ProbeInterval
	g.mlLog = &memberlistLog{log: g.log}
	mc.Logger = log.New(g.mlLog, "", 0)
	mc.Delegate = g
	mc.Events = g
	if g.ml, err = memberlist.Create(mc); err != nil {
		return nil, fmt.Errorf("metadata: gossip on %s: %w", cfg.BindAddr, err)
	}
	return g, nil
}

// memberlistLog is the writer behind memberlist's *log.Logger, so that its
// lines ("[WARN] memberlist: ...", one per Write) reach the gossip logger,
// with its scope, instead of the process's stderr.
//
// memberlist's Shutdown does not wait for its goroutines, and one may
// still be logging a moment later; close drops every line after it, so
// nothing writes to the caller's logger once the gossip is shut down.
type memberlistLog struct {
	log *slog.Logger
	mu  sync.RWMutex
	off bool // under mu
}

// close waits for a line being logged and drops every later one.
func (w *memberlistLog) close() {
	w.mu.Lock()
	w.off = true
	w.mu.Unlock()
}

func (w *memberlistLog) Write(p []byte) (int, error) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.off {
		return len(p), nil
	}
	line := strings.TrimSuffix(string(p), "\n")
	level := slog.LevelInfo
	if tag, msg, ok := strings.Cut(line, " "); ok {
		known := true
		switch tag {
		case "[DEBUG]":
			level = slog.LevelDebug
		case "[INFO]":
		case "[WARN]":
			level = slog.LevelWarn
		case "[ERR]", "[ERROR]":
			level = slog.LevelError
		default:
			known = false
		}
		if known {
			line = msg
		}
	}
	w.log.Log(context.Background(), level, line)
	return len(p), nil
}

func freeUDPTCPPort(host string) (int, error) {
	for range 20 {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", net.JoinHostPort(host, strconv.Itoa(port)))
		l.Close()
		if err == nil {
			u.Close()
			return port, nil
		}
	}
	return 0, errors.New("metadata: no port free for both UDP and TCP gossip")
}

// Addr is the gossip address others join.
func (g *Gossip) Addr() string { return g.addr }

// Run joins seeds, refreshes this node's load every second, and leaves the
// cluster when ctx ends.
func (g *Gossip) Run(ctx context.Context) error {
	defer g.Shutdown()
	// Joining is retried every probe interval while some seed is not a
	// member (new nodes appear in etcd at any time); load is republished
	// every second, or at once after Refresh.
	t := time.NewTicker(g.cfg.ProbeInterval)
	defer t.Stop()
	lastLoad := time.Time{}
	for {
		if time.Since(lastLoad) >= time.Second {
			g.publishLoad()
			lastLoad = time.Now()
		}
		g.join()
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-g.meta:
			lastLoad = time.Time{}
		}
	}
}

// Refresh republishes this node's load now (after an engine report).
func (g *Gossip) Refresh() {
	select {
	case g.meta <- struct{}{}:
	default:
	}
}

func (g *Gossip) publishLoad() {
	if g.cfg.Load == nil {
		return
	}
	b, _ := json.Marshal(g.cfg.Load())
	g.mu.Lock()
	changed := string(b) != string(g.load)
	g.load = b
	g.mu.Unlock()
	if changed {
		if err := g.ml.UpdateNode(time.Second); err != nil {
			g.log.Debug("gossip load update", "err", err)
		}
	}
}

func (g *Gossip) join() {
	if g.cfg.Seeds == nil {
		return
	}
	g.mu.Lock()
	state := map[string]string{}
	for _, p := range g.peers {
		state[p.addr] = p.state
	}
	g.mu.Unlock()
	// Join seeds we have never seen at once; retry dead ones every 10 s,
	// so a partition heals without hammering a host that is gone.
	var todo []string
	for _, s := range g.cfg.Seeds() {
		if s == "" || s == g.Addr() || state[s] == "alive" {
			continue
		}
		if state[s] == "dead" && time.Since(g.lastTry[s]) < 10*time.Second {
			continue
		}
		g.lastTry[s] = time.Now()
		todo = append(todo, s)
	}
	if len(todo) > 0 {
		if _, err := g.ml.Join(todo); err != nil {
			g.log.Debug("gossip join", "seeds", todo, "err", err)
		}
	}
}

// peerCopy is what gossip knows of a node, copied out of memberlist.
type peerCopy struct {
	state string // alive, dead (memberlist reports a leave as a death)
	addr  string
	meta  []byte
}

// Dead reports whether gossip has declared node dead (or seen it leave).
// A node gossip has never seen is not dead.
func (g *Gossip) Dead(node string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	p, ok := g.peers[node]
	return ok && p.state == "dead"
}

// Peers lists every node gossip knows, this one included, with its state
// and load.
func (g *Gossip) Peers() []Peer {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]Peer, 0, len(g.peers))
	for id, pc := range g.peers {
		p := Peer{ID: id, Addr: pc.addr, State: pc.state}
		meta := pc.meta
		if id == g.cfg.NodeID {
			meta = g.load
		}
		json.Unmarshal(meta, &p.Load)
		out = append(out, p)
	}
	return out
}

// NodeMeta implements memberlist.Delegate: our encoded Load.
func (g *Gossip) NodeMeta(limit int) []byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.load) > limit {
		return nil
	}
	return g.load
}

// NotifyMsg implements memberlist.Delegate; we send no user messages.
func (g *Gossip) NotifyMsg([]byte) {}

// GetBroadcasts implements memberlist.Delegate.
func (g *Gossip) GetBroadcasts(overhead, limit int) [][]byte { return nil }

// LocalState implements memberlist.Delegate.
func (g *Gossip) LocalState(join bool) []byte { return nil }

// MergeRemoteState implements memberlist.Delegate.
func (g *Gossip) MergeRemoteState(buf []byte, join bool) {}

// NotifyJoin implements memberlist.EventDelegate. memberlist holds its
// locks here, so the node is copied and nothing calls back into it.
func (g *Gossip) NotifyJoin(n *memberlist.Node) { g.record(n, "alive") }

// NotifyLeave implements memberlist.EventDelegate: a node left or was
// declared dead. (memberlist does not update the Node's State field before
// this call, so the event itself is the news.)
func (g *Gossip) NotifyLeave(n *memberlist.Node) { g.record(n, "dead") }

// NotifyUpdate implements memberlist.EventDelegate: new metadata (load).
func (g *Gossip) NotifyUpdate(n *memberlist.Node) { g.record(n, "alive") }

func (g *Gossip) record(n *memberlist.Node, state string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	p := g.peers[n.Name]
	if p == nil {
		p = &peerCopy{}
		g.peers[n.Name] = p
	}
	if p.state != state && n.Name != g.cfg.NodeID {
		g.log.Info("gossip peer state", "peer", n.Name, "state", state)
	}
	p.state = state
	p.addr = net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
	p.meta = append(p.meta[:0], n.Meta...)
}

// Shutdown leaves the cluster politely and stops gossip. It is idempotent
// and safe without Run.
func (g *Gossip) Shutdown() {
	g.stop.Do(func() {
		if !g.crashed.Load() {
			g.ml.Leave(time.Second)
			g.ml.Shutdown()
		}
		g.mlLog.close()
	})
}

// Crash stops gossip without a goodbye, as a killed process would: peers
// must detect the death. For fault-injection tests; call it before
// cancelling Run.
func (g *Gossip) Crash() {
	g.crashed.Store(true)
	g.ml.Shutdown()
	g.mlLog.close()
}

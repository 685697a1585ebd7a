package metadata

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvpool/kvpool/api"
)

// LinkRecord is one measured link from the publishing node to Peer: what
// the node's transfer layer estimates a fetch from it to Peer costs.
type LinkRecord struct {
	// Peer is the node at the other end of the link.
	Peer string `json:"peer"`
	// BytesPerSecond is the estimated throughput from the publishing node
	// to Peer. Finite and ≥ 0.
	BytesPerSecond float64 `json:"bps"`
	// RTTMicros is the estimated round trip, in microseconds. ≥ 0.
	RTTMicros int64 `json:"rtt_us"`
	// Samples is how many transfers the estimate is built from; 0 means
	// it is still the configured seed, not a measurement. ≥ 0.
	Samples int64 `json:"samples"`
	// FixedMicros is what one fetch over the link costs beyond its round
	// trip and bytes, PerBlockMicros what each block adds, and
	// PerDoublingMicros what each doubling of the chain adds, in
	// microseconds (fractions kept). Finite and ≥ 0.
	FixedMicros       float64 `json:"fixed_us,omitempty"`
	PerBlockMicros    float64 `json:"per_block_us,omitempty"`
	PerDoublingMicros float64 `json:"per_doubling_us,omitempty"`
	// FetchBytesPerSecond is the rate whole fetches moved bytes at (the
	// same fit); 0: not published (an older node), use BytesPerSecond.
	// Finite and ≥ 0.
	FetchBytesPerSecond float64 `json:"fetch_bps,omitempty"`
}

// NodeLinks is what <prefix>links/<node> holds: every link the node
// measured, from itself to its peers. It lives on the node's lease.
type NodeLinks struct {
	// Schema is the record's schema (LinksSchema when written; a record
	// without one is schema 1, see schema.go).
	Schema int `json:"schema,omitempty"`
	// Node is the publishing node: the source of every link.
	Node string `json:"node"`
	// UnixNano is when the node wrote the record.
	UnixNano int64 `json:"unix_nano"`
	// Links lists the links, at most one per peer. Members write them
	// sorted by peer; a decoded record keeps the order it was written in.
	Links []LinkRecord `json:"links"`
}

func (r *LinkRecord) validate() error {
	var errs []error
	if err := api.ValidateName("node id", r.Peer); err != nil {
		errs = append(errs, err)
	}
	if math.IsNaN(r.BytesPerSecond) || math.IsInf(r.BytesPerSecond, 0) || r.BytesPerSecond < 0 {
		errs = append(errs, fmt.Errorf("peer %q: bytes per second %v: want finite and ≥ 0", r.Peer, r.BytesPerSecond))
	}
	if r.RTTMicros < 0 {
		errs = append(errs, fmt.Errorf("peer %q: rtt %dµs: want ≥ 0", r.Peer, r.RTTMicros))
	}
	if r.Samples < 0 {
		errs = append(errs, fmt.Errorf("peer %q: %d samples: want ≥ 0", r.Peer, r.Samples))
	}
	for _, v := range []float64{r.FixedMicros, r.PerBlockMicros, r.PerDoublingMicros, r.FetchBytesPerSecond} {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			errs = append(errs, fmt.Errorf("peer %q: fixed cost, per-block cost, per-doubling cost or fetch rate %v: want finite and ≥ 0", r.Peer, v))
		}
	}
	return errors.Join(errs...)
}

func (r *NodeLinks) validate() error {
	if err := checkSchema("links record", r.Schema, LinksSchema); err != nil {
		return err
	}
	var errs []error
	if err := api.ValidateName("node id", r.Node); err != nil {
		errs = append(errs, err)
	}
	seen := make(map[string]bool, len(r.Links))
	for i := range r.Links {
		l := &r.Links[i]
		if err := l.validate(); err != nil {
			errs = append(errs, err)
			continue
		}
		if seen[l.Peer] {
			errs = append(errs, fmt.Errorf("peer %q listed twice", l.Peer))
		}
		seen[l.Peer] = true
	}
	return errors.Join(errs...)
}

// DecodeNodeLinks parses and validates a links record. Every error wraps
// ErrMalformed.
func DecodeNodeLinks(b []byte) (NodeLinks, error) {
	var r NodeLinks
	if err := json.Unmarshal(b, &r); err != nil {
		return NodeLinks{}, fmt.Errorf("%w: links record: %v", ErrMalformed, err)
	}
	if err := r.validate(); err != nil {
		return NodeLinks{}, fmt.Errorf("%w: links record: %v", ErrMalformed, err)
	}
	return r, nil
}

// linkTolerance is the relative change in a link's throughput or round
// trip that makes a member rewrite its links record at once.
const linkTolerance = 0.05

// linkRefresh is how stale a member lets its published links get when only
// their sample counts moved: the estimates are then republished at most
// this often, so readers can tell seeds and old estimates from fresh ones.
const linkRefresh = 30 * time.Second

// linkChange classifies how links differ from was, both sorted by peer
// with no duplicates. material: a peer appeared or disappeared, a seed
// became a measurement, or a throughput or round trip moved by more than
// linkTolerance of its published value (any move away from 0 counts).
// samples: only sample counts differ.
func linkChange(was, links []LinkRecord) (material, samples bool) {
	if len(was) != len(links) {
		return true, false
	}
	for i := range links {
		a, b := &was[i], &links[i]
		if a.Peer != b.Peer || (a.Samples == 0) != (b.Samples == 0) ||
			moved(a.BytesPerSecond, b.BytesPerSecond) || moved(float64(a.RTTMicros), float64(b.RTTMicros)) {
			return true, false
		}
		if a.Samples != b.Samples {
			samples = true
		}
	}
	return false, samples
}

func moved(was, now float64) bool { return math.Abs(now-was) > linkTolerance*math.Abs(was) }

// sanitizeLinks returns a sorted copy of links without invalid entries and
// later duplicates of a peer, and how many it dropped.
func sanitizeLinks(links []LinkRecord) ([]LinkRecord, int, error) {
	out := make([]LinkRecord, 0, len(links))
	var first error
	for _, l := range links {
		if err := l.validate(); err != nil {
			first = cmp.Or(first, err)
		} else {
			out = append(out, l)
		}
	}
	slices.SortStableFunc(out, func(a, b LinkRecord) int { return strings.Compare(a.Peer, b.Peer) })
	n := len(out)
	out = slices.CompactFunc(out, func(a, b LinkRecord) bool { return a.Peer == b.Peer })
	if first == nil && len(out) < n {
		first = errors.New("a peer named twice")
	}
	return out, len(links) - len(out), first
}

// findLink returns the link to peer in links, sorted by peer.
func findLink(links []LinkRecord, peer string) (LinkRecord, bool) {
	i, ok := slices.BinarySearchFunc(links, peer, func(l LinkRecord, p string) int { return strings.Compare(l.Peer, p) })
	if !ok {
		return LinkRecord{}, false
	}
	return links[i], true
}

// pollLinks calls MemberConfig.Links and returns its valid links, sorted by
// peer; nil without a Links function. Called from Run's goroutine.
func (m *Member) pollLinks() []LinkRecord {
	if m.cfg.Links == nil {
		return nil
	}
	links, dropped, why := sanitizeLinks(m.cfg.Links())
	if dropped != m.links.dropped && dropped > 0 {
		m.log.Warn("dropping invalid or repeated links", "dropped", dropped, "first", why)
	}
	m.links.dropped = dropped
	return links
}

// publishLinks polls Links and writes the node's links record when it
// changed enough since the last write in this lease (see
// MemberConfig.LinkInterval). A failed write is logged and retried at the
// next poll, since the record still differs; only a lost lease ends the
// session, to start a new epoch. Called from Run's goroutine.
func (m *Member) publishLinks(ctx context.Context) error {
	links := m.pollLinks()
	material, samples := linkChange(m.links.written, links)
	now := m.cfg.Now()
	if !material && !(samples && now.Sub(m.links.at) >= linkRefresh) {
		return nil
	}
	key := m.keys.link(m.cfg.Record.ID)
	b, err := json.Marshal(NodeLinks{Schema: LinksSchema, Node: m.cfg.Record.ID, UnixNano: now.UnixNano(), Links: links})
	if err == nil {
		pctx, cancel := context.WithTimeout(ctx, m.cfg.LeaseTTL)
		_, err = m.cfg.Client.Put(pctx, key, string(b), clientv3.WithLease(m.lease))
		cancel()
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		m.count(func(s *MemberStats) { s.LinkFailures++ })
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			m.lease = 0
			return fmt.Errorf("put %s: %w", key, err)
		}
		if !m.links.failing {
			m.log.Warn("could not publish links; retrying at the next poll", "err", err)
		}
		m.links.failing = true
		return nil
	}
	if m.links.failing {
		m.log.Info("published links again")
	}
	m.links.written, m.links.at, m.links.failing = links, now, false
	m.count(func(s *MemberStats) { s.LinkWrites++ })
	return nil
}

package metadata

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/kvpool/kvpool/api"
)

// The etcd layout under the prefix (MemberConfig.Prefix,
// MirrorConfig.Prefix and NewPolicies' prefix; default "/kvpool/"):
//
//	nodes/<node>                         NodeRecord as JSON, on the node's lease
//	loc/<node>/<epoch>/<seq>             a Batch of location records, on the lease
//	links/<node>                         NodeLinks as JSON: the node's measured
//	                                     links to its peers, on the lease
//	policies/<tenant>                    a tenant policy record (JSON), no lease
//
// <epoch> is the node's lease id in hex: every lease a node holds starts a
// new epoch, and mirrors forget what a node published in earlier epochs.
// <seq> is a 16-digit hex counter, so keys sort in write order. A node's
// location batches are a log: adds and removes applied in seq order. To
// keep the log short the node periodically writes its whole set as a
// snapshot (batches flagged as parts of one), then deletes what came
// before; a mirror that sees a complete snapshot replaces the node's set
// with it.

// ErrMalformed marks a record under our prefix that cannot be decoded.
// Mirrors skip and count such records.
var ErrMalformed = errors.New("metadata: malformed record")

// NodeRecord describes a node in etcd.
type NodeRecord struct {
	// Schema is the record's schema (NodeRecordSchema when written; a
	// record without one is schema 1, see schema.go).
	Schema int `json:"schema,omitempty"`
	// ID is the node id.
	ID string `json:"id"`
	// Addrs maps a transport ("grpc", "data", "gossip") to an address.
	Addrs map[string]string `json:"addrs"`
	// CapacityBytes is the node's arena size.
	CapacityBytes int64 `json:"capacity_bytes"`
	// Zone is a free-form failure domain.
	Zone string `json:"zone,omitempty"`
	// Version is the kvpool version the node runs.
	Version string `json:"version"`
	// NamedReads is set by nodes whose transfer server serves reads by
	// block name. A fetcher pins the blocks of a holder without it (a
	// release before named reads, during a rolling upgrade) first: such
	// a holder drops a connection that asks for a block by name.
	NamedReads bool `json:"named_reads,omitempty"`
	// Epoch is the node's current lease id; location batches are keyed by it.
	Epoch int64 `json:"epoch"`
	// StartedUnix is when the node process started, in seconds.
	StartedUnix int64 `json:"started_unix"`
	// Accelerator names the node's engine hardware ("h200"), which picks
	// its default prefill-speed curves in the cost model. Empty: unknown.
	Accelerator string `json:"accelerator,omitempty"`
	// EngineCaches is how many engines' KV event streams the node follows:
	// peers watch its engines' GPU caches when it is not 0.
	EngineCaches int `json:"engine_caches,omitempty"`
	// HostToGPUBytesPerSecond is the rate the node's engines load blocks
	// from its host memory, which prices its host tier in plans; 0:
	// unknown (planners use their own).
	HostToGPUBytesPerSecond float64 `json:"host_to_gpu_bps,omitempty"`
}

func (r *NodeRecord) validate() error {
	if err := checkSchema("node record", r.Schema, NodeRecordSchema); err != nil {
		return err
	}
	if err := api.ValidateName("node id", r.ID); err != nil {
		return err
	}
	if r.Epoch == 0 {
		return errors.New("epoch 0")
	}
	return nil
}

func decodeNode(b []byte) (NodeRecord, error) {
	var r NodeRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("%w: node record: %v", ErrMalformed, err)
	}
	if err := r.validate(); err != nil {
		return r, fmt.Errorf("%w: node record: %v", ErrMalformed, err)
	}
	return r, nil
}

// Op is what a location record does.
type Op uint8

const (
	opInvalid Op = iota
	// OpAdd: the node holds the block.
	OpAdd
	// OpRemove: the node no longer holds the block.
	OpRemove
)

// Record is one location change: block (Tenant, Namespace, Key) is now
// held (OpAdd) or no longer held (OpRemove) by the node that wrote it.
type Record struct {
	Op        Op
	Tenant    string
	Namespace string
	Key       string // raw key bytes
	// queuedNano is when the node queued the change; not encoded. A
	// batch's UnixNano is its oldest record's, so mirror lag counts the
	// wait in the queue too.
	queuedNano int64
}

// Batch is what one loc key holds. A snapshot is written as Parts batches
// with Part 0..Parts-1 and consecutive seqs; its records are all adds and
// together they are the node's whole set. A Reset snapshot replaces what
// the log said before it (a new epoch, or changes lost while etcd was
// away); any other snapshot equals the log before it and only compacts it,
// so a mirror that followed the log can skip it.
type Batch struct {
	Snapshot bool
	Reset    bool
	Part     uint32
	Parts    uint32
	// UnixNano is when the node queued the batch's oldest change (or wrote
	// a snapshot); mirrors measure their lag from it.
	UnixNano int64
	Records  []Record
}

// batchVersion is a location batch's schema, its first byte.
const batchVersion = BatchSchema

// AppendBatch encodes b compactly: names appear once per batch in a small
// table, and records refer to them by index.
//
//	u8 version, u8 flags (1: snapshot, 2: reset), uvarint part, uvarint parts,
//	uvarint unix nanos,
//	uvarint names, names × (uvarint len, tenant, uvarint len, namespace),
//	uvarint records, records × (u8 op, uvarint name index, uvarint len, key)
func AppendBatch(dst []byte, b *Batch) []byte {
	dst = append(dst, batchVersion)
	var flags byte
	if b.Snapshot {
		flags |= 1
	}
	if b.Reset {
		flags |= 2
	}
	dst = append(dst, flags)
	dst = binary.AppendUvarint(dst, uint64(b.Part))
	dst = binary.AppendUvarint(dst, uint64(b.Parts))
	dst = binary.AppendUvarint(dst, uint64(b.UnixNano))
	type pair struct{ t, n string }
	index := map[pair]uint64{}
	var order []pair
	for _, r := range b.Records {
		p := pair{r.Tenant, r.Namespace}
		if _, ok := index[p]; !ok {
			index[p] = uint64(len(order))
			order = append(order, p)
		}
	}
	dst = binary.AppendUvarint(dst, uint64(len(order)))
	for _, p := range order {
		dst = appendString(dst, p.t)
		dst = appendString(dst, p.n)
	}
	dst = binary.AppendUvarint(dst, uint64(len(b.Records)))
	for _, r := range b.Records {
		dst = append(dst, byte(r.Op))
		dst = binary.AppendUvarint(dst, index[pair{r.Tenant, r.Namespace}])
		dst = appendString(dst, r.Key)
	}
	return dst
}

func appendString(dst []byte, s string) []byte {
	return append(binary.AppendUvarint(dst, uint64(len(s))), s...)
}

// DecodeBatch parses a batch. Names and keys are validated: a batch with
// anything a node could not have stored is malformed.
func DecodeBatch(src []byte) (*Batch, error) {
	d := decoder{b: src}
	if v := d.byte(); v != batchVersion {
		if v > batchVersion {
			return nil, fmt.Errorf("%w: location batch of schema %d, from a newer kvpool; this node reads schema %d: upgrade it", ErrMalformed, v, batchVersion)
		}
		return nil, fmt.Errorf("%w: batch version %d", ErrMalformed, v)
	}
	flags := d.byte()
	b := &Batch{Snapshot: flags&1 != 0, Reset: flags&2 != 0, Part: uint32(d.uvarint(1 << 32)), Parts: uint32(d.uvarint(1 << 32)), UnixNano: int64(d.uvarint(1<<63 - 1))}
	if flags&^3 != 0 || flags == 2 {
		d.fail("unknown flags")
	}
	if b.Snapshot && (b.Parts == 0 || b.Part >= b.Parts) {
		d.fail("snapshot part out of range")
	}
	n := d.uvarint(uint64(len(src)))
	type pair struct{ t, n string }
	names := make([]pair, 0, n)
	for i := uint64(0); i < n && d.err == nil; i++ {
		p := pair{d.str(api.MaxNameBytes), d.str(api.MaxNameBytes)}
		if d.err == nil {
			if err := errors.Join(api.ValidateName("tenant", p.t), api.ValidateName("namespace", p.n)); err != nil {
				d.fail(err.Error())
			}
		}
		names = append(names, p)
	}
	count := d.uvarint(uint64(len(src)))
	b.Records = make([]Record, 0, min(count, uint64(len(src))))
	for i := uint64(0); i < count && d.err == nil; i++ {
		op := Op(d.byte())
		ni := d.uvarint(uint64(len(names)))
		key := d.str(api.MaxKeyBytes)
		switch {
		case d.err != nil:
		case op != OpAdd && op != OpRemove:
			d.fail("unknown op " + strconv.Itoa(int(op)))
		case b.Snapshot && op != OpAdd:
			d.fail("remove in a snapshot")
		case ni >= uint64(len(names)):
			d.fail("name index out of range")
		case key == "":
			d.fail("empty key")
		default:
			b.Records = append(b.Records, Record{Op: op, Tenant: names[ni].t, Namespace: names[ni].n, Key: key})
		}
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("trailing bytes")
	}
	if d.err != nil {
		return nil, d.err
	}
	return b, nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(why string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: batch: %s", ErrMalformed, why)
	}
	d.b = nil
}

func (d *decoder) byte() byte {
	if len(d.b) == 0 {
		d.fail("truncated")
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) uvarint(limit uint64) uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.b = d.b[n:]
	if v > limit {
		d.fail("value out of range")
		return 0
	}
	return v
}

func (d *decoder) str(limit int) string {
	n := d.uvarint(uint64(limit))
	if d.err != nil {
		return ""
	}
	if uint64(len(d.b)) < n {
		d.fail("truncated string")
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

// keys builds and parses our etcd keys.
type keys struct{ prefix string }

func (k keys) node(id string) string       { return k.prefix + "nodes/" + id }
func (k keys) nodes() string               { return k.prefix + "nodes/" }
func (k keys) locs() string                { return k.prefix + "loc/" }
func (k keys) nodeLocs(id string) string   { return k.prefix + "loc/" + id + "/" }
func (k keys) policy(tenant string) string { return k.prefix + "policies/" + tenant }
func (k keys) policies() string            { return k.prefix + "policies/" }
func (k keys) links() string               { return k.prefix + "links/" }
func (k keys) link(id string) string       { return k.prefix + "links/" + id }
func (k keys) epochLocs(id string, epoch int64) string {
	return k.nodeLocs(id) + strconv.FormatInt(epoch, 16) + "/"
}

func (k keys) loc(id string, epoch int64, seq uint64) string {
	return fmt.Sprintf("%s%016x", k.epochLocs(id, epoch), seq)
}

// parseLoc splits a loc key into node, epoch and seq.
func (k keys) parseLoc(key string) (node string, epoch int64, seq uint64, err error) {
	rest, ok := strings.CutPrefix(key, k.locs())
	parts := strings.Split(rest, "/")
	if !ok || len(parts) != 3 {
		return "", 0, 0, fmt.Errorf("%w: location key %q", ErrMalformed, key)
	}
	if epoch, err = strconv.ParseInt(parts[1], 16, 64); err != nil || epoch == 0 {
		return "", 0, 0, fmt.Errorf("%w: location key %q: epoch", ErrMalformed, key)
	}
	if len(parts[2]) != 16 {
		return "", 0, 0, fmt.Errorf("%w: location key %q: seq", ErrMalformed, key)
	}
	if seq, err = strconv.ParseUint(parts[2], 16, 64); err != nil {
		return "", 0, 0, fmt.Errorf("%w: location key %q: seq", ErrMalformed, key)
	}
	if err := api.ValidateName("node id", parts[0]); err != nil {
		return "", 0, 0, fmt.Errorf("%w: location key %q: %v", ErrMalformed, key, err)
	}
	return parts[0], epoch, seq, nil
}

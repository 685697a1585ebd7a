package metadata

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvpool/kvpool/internal/eventually"
)

func readFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/schema/v1/" + name)
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasSuffix(name, ".hex") {
		if b, err = hex.DecodeString(strings.TrimSpace(string(b))); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

var (
	v1Node = NodeRecord{ID: "gpu-node-1", Addrs: map[string]string{"grpc": "10.0.0.11:7070", "data": "10.0.0.11:7070", "gossip": "10.0.0.11:7946", "shm": "/run/kvpool/kvpool.sock"},
		CapacityBytes: 64 << 30, Zone: "rack-a", Version: "v0.0.0-20261202", Epoch: 7587869573419122177, StartedUnix: 1796169600,
		Accelerator: "h200", EngineCaches: 1, HostToGPUBytesPerSecond: 54.46e9}
	v1Links = NodeLinks{Node: "gpu-node-1", UnixNano: 1796169660000000000, Links: []LinkRecord{{Peer: "gpu-node-2", BytesPerSecond: 4.7e9, RTTMicros: 85, Samples: 12,
		FixedMicros: 190, PerBlockMicros: 31, PerDoublingMicros: 150, FetchBytesPerSecond: 3.9e9}}}
	v1Batch = Batch{UnixNano: 1796169601000000000, Records: []Record{
		{Op: OpAdd, Tenant: "acme", Namespace: "llama3-8b", Key: "\x00\x01block-0"},
		{Op: OpAdd, Tenant: "acme", Namespace: "llama3-8b", Key: "block-1"},
		{Op: OpRemove, Tenant: "beta", Namespace: "llama3-70b", Key: "old"}}}
	v1Snapshot = Batch{Snapshot: true, Reset: true, Part: 0, Parts: 2, UnixNano: 1796169602000000000, Records: []Record{
		{Op: OpAdd, Tenant: "acme", Namespace: "llama3-8b", Key: "block-1"}}}
)

// Records as the previous version wrote them (no schema field) decode to
// exactly what was written; location batches still encode byte for byte
// as they did.
func TestSchemaV1RecordsDecode(t *testing.T) {
	node, err := decodeNode(readFixture(t, "node.json"))
	if err != nil || !reflect.DeepEqual(node, v1Node) {
		t.Fatalf("v1 node record: %+v, %v; want %+v", node, err, v1Node)
	}
	links, err := DecodeNodeLinks(readFixture(t, "links.json"))
	if err != nil || !reflect.DeepEqual(links, v1Links) {
		t.Fatalf("v1 links record: %+v, %v; want %+v", links, err, v1Links)
	}
	for name, want := range map[string]*Batch{"batch.hex": &v1Batch, "snapshot.hex": &v1Snapshot} {
		b := readFixture(t, name)
		got, err := DecodeBatch(b)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("v1 %s: %+v, %v; want %+v", name, got, err, want)
		}
		if enc := AppendBatch(nil, want); string(enc) != string(b) {
			t.Errorf("%s: this build encodes %x, schema 1 is %x: a new layout needs a new schema", name, enc, b)
		}
	}
}

// nodeRecordV1 and nodeLinksV1 are the schema-1 readers frozen as the
// previous version had them, to check that it reads what this one
// writes: a mixed-version cluster during a rolling upgrade.
type nodeRecordV1 struct {
	ID                      string            `json:"id"`
	Addrs                   map[string]string `json:"addrs"`
	CapacityBytes           int64             `json:"capacity_bytes"`
	Zone                    string            `json:"zone,omitempty"`
	Version                 string            `json:"version"`
	Epoch                   int64             `json:"epoch"`
	StartedUnix             int64             `json:"started_unix"`
	Accelerator             string            `json:"accelerator,omitempty"`
	EngineCaches            int               `json:"engine_caches,omitempty"`
	HostToGPUBytesPerSecond float64           `json:"host_to_gpu_bps,omitempty"`
}

type nodeLinksV1 struct {
	Node     string       `json:"node"`
	UnixNano int64        `json:"unix_nano"`
	Links    []LinkRecord `json:"links"`
}

func TestPreviousVersionReadsThisVersionsRecords(t *testing.T) {
	rec := v1Node
	rec.Schema = NodeRecordSchema
	b, _ := json.Marshal(rec)
	var old nodeRecordV1
	if err := json.Unmarshal(b, &old); err != nil {
		t.Fatal(err)
	}
	if got, _ := json.Marshal(old); string(got)+"\n" != string(readFixture(t, "node.json")) {
		t.Errorf("the previous version reads this one's node record as %s", got)
	}
	l := v1Links
	l.Schema = LinksSchema
	b, _ = json.Marshal(l)
	var oldLinks nodeLinksV1
	if err := json.Unmarshal(b, &oldLinks); err != nil || !reflect.DeepEqual(oldLinks.Links, v1Links.Links) || oldLinks.Node != v1Links.Node {
		t.Errorf("the previous version reads this one's links record as %+v (%v)", oldLinks, err)
	}
}

// A newer kvpool of the same schema may add fields: they are ignored. A
// newer schema is refused with a message, not misread.
func TestSchemaNewerRecords(t *testing.T) {
	withField := strings.Replace(string(readFixture(t, "node.json")), `{"id"`, `{"schema":1,"drain_state":"draining","id"`, 1)
	if got, err := decodeNode([]byte(withField)); err != nil || got.ID != v1Node.ID || got.Schema != 1 {
		t.Errorf("a node record with a field from a newer version: %+v, %v", got, err)
	}
	for name, rec := range map[string][]byte{
		"node":  []byte(strings.Replace(string(readFixture(t, "node.json")), `{"id"`, `{"schema":2,"id"`, 1)),
		"links": []byte(strings.Replace(string(readFixture(t, "links.json")), `{"node"`, `{"schema":2,"node"`, 1)),
		"batch": append([]byte{BatchSchema + 1}, readFixture(t, "batch.hex")[1:]...),
	} {
		var err error
		switch name {
		case "node":
			_, err = decodeNode(rec)
		case "links":
			_, err = DecodeNodeLinks(rec)
		case "batch":
			_, err = DecodeBatch(rec)
		}
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "from a newer kvpool") || !strings.Contains(err.Error(), "upgrade") {
			t.Errorf("%s record of schema 2: %v, want ErrMalformed saying to upgrade", name, err)
		}
	}
}

// A mirror of this version follows a node of the previous version: its
// node record and location batches, in schema 1 as it wrote them, put
// into etcd on a lease as its member would.
func TestMirrorFollowsAPreviousVersionNode(t *testing.T) {
	e := startEtcd(t)
	cli := newClient(t, e.ClientURL())
	ctx := context.Background()
	lease, err := cli.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	rec := strings.Replace(string(readFixture(t, "node.json")), "7587869573419122177", jsonInt(int64(lease.ID)), 1)
	k := keys{"/kvpool/"}
	for key, value := range map[string]string{
		k.node(v1Node.ID):                    rec,
		k.loc(v1Node.ID, int64(lease.ID), 1): string(readFixture(t, "batch.hex")),
		k.link(v1Node.ID):                    string(readFixture(t, "links.json")),
	} {
		if _, err := cli.Put(ctx, key, value, clientv3.WithLease(lease.ID)); err != nil {
			t.Fatal(err)
		}
	}
	mm := startMirror(t, cli)
	eventually.True(t, "the mirror to see the old node's blocks", patience, func() bool {
		r := mm.Locate("acme", "llama3-8b", [][]byte{[]byte("\x00\x01block-0"), []byte("block-1")})
		return len(mm.Nodes()) == 1 && r.Deepest == 2
	})
	if s := mm.Stats(); s.Malformed != 0 {
		t.Fatalf("the mirror skipped %d of the old node's records", s.Malformed)
	}
	if l, ok := mm.Link(v1Node.ID, "gpu-node-2"); !ok || l.BytesPerSecond != 4.7e9 {
		t.Fatalf("the old node's link: %+v %v", l, ok)
	}
}

func jsonInt(v int64) string { b, _ := json.Marshal(v); return string(b) }

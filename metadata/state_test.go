package metadata

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestStateDataDriven pins the mirror's state machine: epochs, ordered
// batches, gaps, reset and compaction snapshots, node loss, and Locate.
//
//	node id=a epoch=1            a node record (new epoch forgets the old)
//	drop id=a                    the node record was deleted
//	batch id=a epoch=1 seq=0 add=k1,k2 remove=k3 [ns=t/n]
//	snap id=a epoch=1 seq=4 part=0 parts=2 [reset] add=k1
//	locate chain=k1,k2,k3 [dead=b] [ns=t/n]
//	dump
func TestStateDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata/state", func(t *testing.T, path string) {
		s := newState()
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			arg := func(k string) string {
				var v string
				if d.HasArg(k) {
					d.ScanArgs(t, k, &v)
				}
				return v
			}
			num := func(k string) uint64 {
				v, err := strconv.ParseUint(arg(k), 10, 64)
				if err != nil {
					t.Fatalf("%s: %v", k, err)
				}
				return v
			}
			ns := func() (string, string) {
				if v := arg("ns"); v != "" {
					a, b, _ := strings.Cut(v, "/")
					return a, b
				}
				return "t", "n"
			}
			list := func(k string) []string {
				if v := arg(k); v != "" {
					return strings.Split(v, ",")
				}
				return nil
			}
			records := func() []Record {
				tn, nn := ns()
				var out []Record
				for _, k := range list("add") {
					out = append(out, Record{Op: OpAdd, Tenant: tn, Namespace: nn, Key: k})
				}
				for _, k := range list("remove") {
					out = append(out, Record{Op: OpRemove, Tenant: tn, Namespace: nn, Key: k})
				}
				return out
			}
			switch d.Cmd {
			case "node":
				s.upsertNode(NodeRecord{ID: arg("id"), Epoch: int64(num("epoch"))})
				return "ok"
			case "drop":
				s.dropNode(arg("id"))
				return "ok"
			case "batch", "snap":
				b := &Batch{Records: records()}
				if d.Cmd == "snap" {
					b.Snapshot, b.Reset, b.Part, b.Parts = true, d.HasArg("reset"), uint32(num("part")), uint32(num("parts"))
				}
				if !s.applyBatch(arg("id"), int64(num("epoch")), num("seq"), b) {
					return "ignored"
				}
				return "applied"
			case "locate":
				tn, nn := ns()
				dead := map[string]bool{}
				for _, id := range list("dead") {
					dead[id] = true
				}
				var chain [][]byte
				for _, k := range list("chain") {
					chain = append(chain, []byte(k))
				}
				r := s.locate(tn, nn, chain, func(id string) bool { return dead[id] })
				return fmt.Sprintf("nodes=%v deepest=%d by %v pool=%d", r.Nodes, r.Deepest, r.DeepestNodes, r.PoolPrefix)
			case "dump":
				c := s.content()
				if len(c) == 0 {
					return "empty"
				}
				return strings.Join(c, "\n")
			}
			t.Fatalf("unknown command %s", d.Cmd)
			return ""
		})
	})
}

package eviction

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

// ddEpoch is time 0 of the datadriven files: at=N and expires=N are N
// seconds after it.
var ddEpoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// TestDataDriven pins each policy's exact behaviour with
// testdata/<kind>. Commands:
//
//	new [counters=N]                       start over with an empty policy
//	add id=1 [bytes=B] [parent=P] [expires=S] [at=S] [hash=H]
//	add id=(1,2) ...                       several blocks, same fields
//	add chain=(1,2,3) [parent=P] ...       a chain: 1's parent is P, 2's is 1, ...
//	                                       (the input lines, if any, are more
//	                                       add arguments, one block per line)
//	touch id=1 [at=S] [n=N]                N touches of each id (default 1)
//	miss hash=(7,8) [n=N]                  N misses of each key hash
//	remove id=2
//	victim [at=S] [pinned=(1,3)]           prints the victim or "none"
//	admit id=9 [hash=H] victim=2           prints whether 9 is admitted
//	evict-all [at=S] [pinned=(...)]        evicts Victims until none; prints them
//	stats                                  prints Len and Bytes
//	freq id=(1,2)                          LFU only: prints the estimates of
//	                                       the ids' keys (stored hash if held)
//	freq hash=(7,8)                        LFU only: prints estimates by hash
//
// Run with -rewrite to regenerate the expected output.
func TestDataDriven(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.String(), func(t *testing.T) {
			p := New(k, Config{})
			datadriven.RunTest(t, filepath.Join("testdata", k.String()), func(t *testing.T, d *datadriven.TestData) string {
				args := ddArgs{t: t, d: d, args: d.CmdArgs}
				now := args.time("at")
				switch d.Cmd {
				case "new":
					p = New(k, Config{Counters: int(args.int("counters", 0))})
				case "add":
					lines := []ddArgs{args}
					if in := strings.TrimSpace(d.Input); in != "" {
						lines = lines[:0]
						for _, l := range strings.Split(in, "\n") {
							_, a, err := datadriven.ParseLine("add " + l)
							if err != nil {
								d.Fatalf(t, "%v", err)
							}
							lines = append(lines, ddArgs{t: t, d: d, args: append(a, d.CmdArgs...)})
						}
					}
					for _, a := range lines {
						b := Block{Bytes: a.int("bytes", 0), Parent: ID(a.int("parent", 0)), Expires: a.time("expires"), Hash: a.hash()}
						if chain := a.ids("chain"); chain != nil {
							for _, id := range chain {
								b.ID = id
								p.Add(b, a.time("at"))
								b.Parent = id
							}
							continue
						}
						for _, id := range a.ids("id") {
							b.ID = id
							p.Add(b, a.time("at"))
						}
					}
				case "touch":
					for range args.int("n", 1) {
						for _, id := range args.ids("id") {
							p.Touch(id, now)
						}
					}
				case "miss":
					for range args.int("n", 1) {
						for _, h := range args.uints("hash") {
							p.Miss(h)
						}
					}
				case "remove":
					for _, id := range args.ids("id") {
						p.Remove(id)
					}
				case "victim":
					id, ok := p.Victim(now, args.pinned())
					if !ok {
						return "none\n"
					}
					return fmt.Sprintf("%d\n", id)
				case "admit":
					return fmt.Sprintf("%t\n", p.Admit(Block{ID: ID(args.int("id", 0)), Hash: args.hash()}, ID(args.int("victim", 0))))
				case "evict-all":
					pinned := args.pinned()
					var out []string
					for {
						id, ok := p.Victim(now, pinned)
						if !ok {
							break
						}
						p.Remove(id)
						out = append(out, strconv.FormatUint(uint64(id), 10))
					}
					if out == nil {
						return "none\n"
					}
					return strings.Join(out, " ") + "\n"
				case "stats":
					return fmt.Sprintf("len=%d bytes=%d\n", p.Len(), p.Bytes())
				case "freq":
					l, ok := p.(*lfu)
					if !ok {
						d.Fatalf(t, "freq: %v is not LFU", k)
					}
					var out []string
					for _, id := range args.ids("id") {
						out = append(out, fmt.Sprintf("%d:%d", id, l.estimate(l.keyHash(id))))
					}
					for _, h := range args.uints("hash") {
						out = append(out, fmt.Sprintf("h%d:%d", h, l.estimate(h)))
					}
					return strings.Join(out, " ") + "\n"
				default:
					d.Fatalf(t, "unknown command %q", d.Cmd)
				}
				return ""
			})
		})
	}
}

// ddArgs reads the arguments of one datadriven command (or input line).
type ddArgs struct {
	t    *testing.T
	d    *datadriven.TestData
	args []datadriven.CmdArg
}

func (a ddArgs) vals(key string) []string {
	for _, arg := range a.args {
		if arg.Key == key {
			return arg.Vals
		}
	}
	return nil
}

func (a ddArgs) uints(key string) []uint64 {
	vs := a.vals(key)
	out := make([]uint64, len(vs))
	for i, v := range vs {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			a.d.Fatalf(a.t, "%s: %v", key, err)
		}
		out[i] = n
	}
	return out
}

func (a ddArgs) int(key string, def int64) int64 {
	switch vs := a.uints(key); len(vs) {
	case 0:
		return def
	case 1:
		return int64(vs[0])
	}
	a.d.Fatalf(a.t, "%s: want one value", key)
	return 0
}

func (a ddArgs) ids(key string) []ID {
	vs := a.uints(key)
	if len(vs) == 0 {
		return nil
	}
	out := make([]ID, len(vs))
	for i, v := range vs {
		out[i] = ID(v)
	}
	return out
}

// hash returns the hash argument, 0 if absent.
func (a ddArgs) hash() uint64 { return uint64(a.int("hash", 0)) }

// time returns ddEpoch plus key seconds; absent or 0 means the zero time.
func (a ddArgs) time(key string) time.Time {
	s := a.int(key, 0)
	if s == 0 {
		return time.Time{}
	}
	return ddEpoch.Add(time.Duration(s) * time.Second)
}

// pinned returns the pinned set, or nil if there is none.
func (a ddArgs) pinned() func(ID) bool {
	ids := a.ids("pinned")
	if ids == nil {
		return nil
	}
	return func(id ID) bool {
		for _, p := range ids {
			if p == id {
				return true
			}
		}
		return false
	}
}

package deptest

// Graph is kvpool's import graph, one row per package of the module, keyed
// by its path inside the module. The DAG is api ← {eviction, metadata,
// transfer} ← pool ← cmd; test imports anything.
var Graph = map[string]Rules{
	// What engines embed: no server-side code, no etcd, no metrics, no
	// policies.
	"api":           {Forbidden: clientSide},
	"api/kvpool/v1": {Forbidden: clientSide},
	// The operator's client and the chain hash: api's side, beside it.
	"api/admin": {Forbidden: append(own("pool/...", "metadata/...", "transfer/...", "cmd/...", "test/..."), "go.etcd.io/...")},
	"api/chain": {Forbidden: own("pool/...", "metadata/...", "transfer/...", "cmd/...", "test/...")},
	// Identities, credentials and the access table: pure, shared by the
	// node that enforces them and the clients that present them.
	"api/auth": {Forbidden: clientSide},
	// The wire protocol, the seqlock and the checksum stay small enough
	// to read whole.
	"api/wire":             {OnlyModules: []string{}},
	"api/internal/seqlock": {OnlyModules: []string{}},
	"api/internal/crc32c":  {OnlyModules: []string{"golang.org/x/sys/cpu"}},
	// Pure policies (its own TestDeps also bans goroutines, locks, I/O and
	// clocks in its code).
	"eviction": {Forbidden: own("api/...", "pool/...", "metadata/...", "transfer/...", "cmd/...", "test/...")},
	// The cluster map talks to etcd as a client only; the server is in
	// metadata/embedded, which only cmd and tests start.
	"metadata": {Forbidden: append(own("metadata/embedded", "pool/...", "transfer/...", "eviction/...", "cmd/...", "test/..."), etcdServer)},
	// Engines' KV events, decoded and indexed: pure, on api/chain for the
	// keys (its own TestDeps bans goroutines, locks, I/O and clocks).
	"metadata/kvevents": {Forbidden: append(own("metadata", "metadata/embedded", "pool/...", "transfer/...", "eviction/...", "cmd/...", "test/..."),
		"go.etcd.io/...", "github.com/hashicorp/...")},
	// Following the engines' event streams: ZeroMQ and the index.
	"metadata/engines": {Forbidden: append(own("metadata", "metadata/embedded", "pool/...", "transfer/...", "eviction/...", "cmd/...", "test/..."),
		"go.etcd.io/...", "github.com/hashicorp/...")},
	"metadata/embedded": {Forbidden: own("pool/...", "transfer/...", "cmd/...", "test/...")},
	// Transports move bytes and measure links: beside metadata, needing
	// neither the cost model nor the control plane.
	"transfer": {Forbidden: append(own("pool/...", "metadata/...", "eviction/...", "cmd/...", "test/...", "transfer/cost"),
		"go.etcd.io/...", "github.com/hashicorp/memberlist")},
	// The cost model is pure: the standard library and a YAML decoder.
	"transfer/cost": {OnlyModules: []string{"sigs.k8s.io/yaml/...", "go.yaml.in/yaml/..."}},
	// The simulator: pure, on the cost model and the eviction policies
	// (its own TestDeps bans goroutines, locks, I/O and the clock).
	"transfer/sim": {Forbidden: own("api/...", "pool/...", "metadata/...", "cmd/...", "test/...")},
	// The store keeps blocks in an arena it is handed, below the node.
	"pool/store": {Forbidden: append(own("pool", "pool/bench", "metadata/...", "transfer/...", "cmd/...", "test/..."),
		"go.etcd.io/...", "github.com/hashicorp/...", "github.com/prometheus/...")},
	// The index journal: records and their file, on api's checksum; it
	// knows nothing of the store whose blocks it records.
	"pool/journal": {Forbidden: append(own("pool", "pool/store", "pool/bench", "pool/replay", "metadata/...", "transfer/...", "eviction/...", "cmd/...", "test/..."),
		"go.etcd.io/...", "github.com/hashicorp/...", "github.com/prometheus/...")},
	// The disk tier: block files on the eviction policies and api's
	// checksum; it knows nothing of the store in front of it.
	"pool/disk": {Forbidden: append(own("pool", "pool/store", "pool/journal", "pool/bench", "pool/replay", "metadata/...", "transfer/...", "cmd/...", "test/..."),
		"go.etcd.io/...", "github.com/hashicorp/...", "github.com/prometheus/...")},
	// The node wires api, eviction, metadata and transfer, and links no
	// etcd server; the bench harness runs nodes on an etcd it is given.
	"pool":       {Forbidden: append(own("metadata/embedded", "pool/bench", "cmd/...", "test/...", "internal/..."), etcdServer)},
	"pool/bench": {Forbidden: append(own("metadata/embedded", "cmd/...", "test/..."), etcdServer)},
	// The replay drives daemons as their clients and engines: no node of
	// its own, no etcd.
	"pool/replay": {Forbidden: append(own("pool", "pool/store", "pool/bench", "metadata/...", "cmd/...", "test/..."), "go.etcd.io/...")},
	"cmd/kvpool":  {Forbidden: own("test/...")},
	// Test helpers: the standard library only, or anything for the
	// cluster tests.
	"internal/deptest":    {OnlyModules: []string{}},
	"internal/eventually": {OnlyModules: []string{}},
	"internal/hugepages":  {OnlyModules: []string{}},
	"test":                {},
	"test/cluster":        {},
	"test/redisbench":     {},
	"test/restartbench":   {},
	// The drain and rolling-restart harness runs daemons as processes and
	// speaks to them as a client: no node of its own.
	"test/rolling":      {Forbidden: own("pool", "pool/...", "metadata/...", "cmd/...")},
	"test/rollingbench": {Forbidden: own("pool", "pool/...", "metadata/...", "cmd/...")},
}

const etcdServer = "go.etcd.io/etcd/server/v3/..."

var clientSide = append(own("pool/...", "metadata/...", "transfer/...", "eviction/...", "cmd/...", "test/..."),
	"go.etcd.io/...", "github.com/hashicorp/...", "github.com/prometheus/...", "github.com/dgraph-io/...")

// own names packages of the module by their paths inside it.
func own(paths ...string) []string {
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = Module + "/" + p
	}
	return out
}

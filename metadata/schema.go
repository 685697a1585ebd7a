package metadata

import "fmt"

// Schema versions of the records kvpool keeps in etcd. The rules that
// let daemons of different versions share one cluster (a rolling upgrade
// runs them side by side):
//
//   - Within a schema, a record only gains optional fields. A reader
//     ignores fields it does not know, and a field a writer left out
//     reads as its zero value, so an older daemon reads a newer one's
//     records and a newer daemon reads an older one's.
//   - A change an older reader would misread (a field that changes
//     meaning, a new location-batch layout) bumps the schema. A reader
//     refuses a record of a schema newer than it knows (ErrMalformed,
//     counted and skipped, with a message to upgrade) rather than
//     misread it, and reads every older schema, so writers keep writing
//     the older schema until no daemon of the older version runs.
//   - Records written before records carried a schema (kvpool up to
//     2026-12) have none: they are schema 1, the encodings in
//     testdata/schema/v1, which every later version must read.
//
// Tenant policy records are package eviction's (its TenantConfig JSON),
// under the same rules.
const (
	// NodeRecordSchema is the schema of nodes/<node> (NodeRecord, JSON).
	NodeRecordSchema = 1
	// LinksSchema is the schema of links/<node> (NodeLinks, JSON).
	LinksSchema = 1
	// BatchSchema is the schema of loc/<node>/<epoch>/<seq> (a Batch,
	// binary), its first byte.
	BatchSchema = 1
)

// checkSchema refuses a record of a schema this build does not read.
// Schema 0 is a record written before schemas, which is schema 1.
func checkSchema(what string, schema, current int) error {
	switch {
	case schema < 0:
		return fmt.Errorf("%s schema %d", what, schema)
	case schema > current:
		return fmt.Errorf("%s of schema %d, from a newer kvpool; this node reads schemas 1 to %d: upgrade it", what, schema, current)
	}
	return nil
}

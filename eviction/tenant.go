package eviction

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"
)

// TenantConfig is how one tenant's blocks are kept on a node. It is what
// an operator sets with `kvpool admin policy set`, stored in etcd as
// JSON and applied live by every daemon.
type TenantConfig struct {
	// Policy orders the tenant's blocks for eviction. Default LRU.
	Policy Kind
	// QuotaBytes caps what the tenant stores on one node, and is also what
	// node-wide pressure never evicts it below. 0 means no quota: no cap,
	// no guarantee.
	QuotaBytes int64
	// High and Low are fractions of the quota: once the tenant's usage
	// passes High×quota, it evicts down to Low×quota. Defaults 0.95 and
	// 0.85; 0 < Low ≤ High ≤ 1.
	High, Low float64
	// DefaultTTL is how long a block lives after it is stored; 0 means
	// forever.
	DefaultTTL time.Duration

	// The node's disk tier, when it has one (pool/disk). NoDisk keeps the
	// tenant's blocks in memory only.
	NoDisk bool
	// DiskAdmitReads is how many times a block must be read in memory
	// before it is copied to disk, so that it survives leaving memory:
	// blocks read once are rarely read again, and every write costs disk
	// bandwidth and endurance (Dynamo's KVBM filters its SSD writes the
	// same way). Default 2; 1 copies every block that is read.
	DiskAdmitReads int
	// DiskQuotaBytes caps what the tenant keeps on one node's disk, and is
	// what disk-wide pressure never evicts it below, as QuotaBytes does in
	// memory. 0 means no quota.
	DiskQuotaBytes int64
}

// DefaultDiskAdmitReads is TenantConfig.DiskAdmitReads's default.
const DefaultDiskAdmitReads = 2

// MaxDiskAdmitReads bounds TenantConfig.DiskAdmitReads: a store counts a
// block's reads in 7 bits.
const MaxDiskAdmitReads = 127

// Default watermarks.
const (
	DefaultHigh = 0.95
	DefaultLow  = 0.85
)

// WithDefaults fills unset fields.
func (c TenantConfig) WithDefaults() TenantConfig {
	if c.Policy == 0 {
		c.Policy = LRU
	}
	if c.DiskAdmitReads == 0 {
		c.DiskAdmitReads = DefaultDiskAdmitReads
	}
	if c.High == 0 && c.Low == 0 {
		c.High, c.Low = DefaultHigh, DefaultLow
	} else if c.High == 0 {
		c.High = max(DefaultHigh, c.Low)
	} else if c.Low == 0 {
		c.Low = min(DefaultLow, c.High)
	}
	return c
}

// Validate reports every problem with c (after defaults).
func (c TenantConfig) Validate() error {
	var errs []error
	if c.Policy == 0 || int(c.Policy) >= len(kindNames) {
		errs = append(errs, fmt.Errorf("unknown policy %v", c.Policy))
	}
	if c.QuotaBytes < 0 {
		errs = append(errs, fmt.Errorf("quota %d bytes must not be negative", c.QuotaBytes))
	}
	bad := func(f float64) bool { return math.IsNaN(f) || f <= 0 || f > 1 }
	switch {
	case bad(c.High) || bad(c.Low):
		errs = append(errs, fmt.Errorf("watermarks high %v and low %v must be in (0, 1]", c.High, c.Low))
	case c.Low > c.High:
		errs = append(errs, fmt.Errorf("low watermark %v is above the high watermark %v", c.Low, c.High))
	}
	if c.DefaultTTL < 0 {
		errs = append(errs, fmt.Errorf("default TTL %v must not be negative", c.DefaultTTL))
	}
	if c.DiskAdmitReads < 1 || c.DiskAdmitReads > MaxDiskAdmitReads {
		errs = append(errs, fmt.Errorf("disk admission after %d reads: want 1 to %d", c.DiskAdmitReads, MaxDiskAdmitReads))
	}
	if c.DiskQuotaBytes < 0 {
		errs = append(errs, fmt.Errorf("disk quota %d bytes must not be negative", c.DiskQuotaBytes))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("eviction: invalid tenant config: %w", err)
	}
	return nil
}

// PolicySchema is the schema of a stored tenant config (etcd's
// policies/<tenant>), under package metadata's rules (schema.go there):
// within a schema fields are only added, a newer schema is refused, and a
// record without a schema is schema 1 (testdata/schema/v1/policy.json).
const PolicySchema = 1

// tenantJSON is TenantConfig's stored form.
type tenantJSON struct {
	Schema     int     `json:"schema,omitempty"`
	Policy     string  `json:"policy"`
	QuotaBytes int64   `json:"quota_bytes"`
	High       float64 `json:"high_watermark"`
	Low        float64 `json:"low_watermark"`
	TTLSeconds float64 `json:"default_ttl_seconds,omitempty"`
	NoDisk     bool    `json:"no_disk,omitempty"`
	DiskReads  int     `json:"disk_admit_reads,omitempty"`
	DiskQuota  int64   `json:"disk_quota_bytes,omitempty"`
}

// MarshalJSON encodes c as stored in etcd.
func (c TenantConfig) MarshalJSON() ([]byte, error) {
	return json.Marshal(tenantJSON{Schema: PolicySchema, Policy: c.Policy.String(), QuotaBytes: c.QuotaBytes, High: c.High, Low: c.Low, TTLSeconds: c.DefaultTTL.Seconds(),
		NoDisk: c.NoDisk, DiskReads: c.DiskAdmitReads, DiskQuota: c.DiskQuotaBytes})
}

// UnmarshalJSON decodes and validates a stored config, filling defaults.
func (c *TenantConfig) UnmarshalJSON(b []byte) error {
	var j tenantJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return fmt.Errorf("eviction: tenant config: %w", err)
	}
	if j.Schema > PolicySchema || j.Schema < 0 {
		return fmt.Errorf("eviction: tenant config of schema %d, from a newer kvpool; this node reads schemas 1 to %d: upgrade it", j.Schema, PolicySchema)
	}
	var errs []error
	var k Kind
	if j.Policy != "" {
		var err error
		if k, err = ParseKind(j.Policy); err != nil {
			errs = append(errs, err)
		}
	}
	if math.IsNaN(j.TTLSeconds) || math.IsInf(j.TTLSeconds, 0) || j.TTLSeconds < 0 || j.TTLSeconds > 1e9 {
		errs = append(errs, fmt.Errorf("default TTL %v s: want 0 to 1e9", j.TTLSeconds))
		j.TTLSeconds = 0
	}
	got := TenantConfig{Policy: k, QuotaBytes: j.QuotaBytes, High: j.High, Low: j.Low, DefaultTTL: time.Duration(j.TTLSeconds * float64(time.Second)),
		NoDisk: j.NoDisk, DiskAdmitReads: j.DiskReads, DiskQuotaBytes: j.DiskQuota}.WithDefaults()
	if len(errs) == 0 {
		if err := got.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	*c = got
	return nil
}

// TenantUsage is a tenant's standing when a node must free space.
type TenantUsage struct {
	// UsedBytes is what the tenant stores on the node; QuotaBytes its
	// quota (0: none).
	UsedBytes, QuotaBytes int64
	// Evictable is whether the tenant has a block that may be evicted
	// (not pinned, not leased).
	Evictable bool
}

// PickTenant chooses whose block node-wide pressure evicts next: a tenant
// over its quota (a quota lowered live), the one furthest over first;
// else a tenant without a quota, the one storing the most first, so
// pressure falls on the largest users of the shared space. A tenant at or
// under its quota is never chosen: its quota is its guarantee. ok is
// false when nobody can give anything back.
func PickTenant(ts []TenantUsage) (i int, ok bool) {
	best, bestOver, bestUsed := -1, false, int64(0)
	for j, t := range ts {
		if !t.Evictable || t.UsedBytes <= 0 {
			continue
		}
		var over bool
		var amount int64
		switch {
		case t.QuotaBytes > 0 && t.UsedBytes > t.QuotaBytes:
			over, amount = true, t.UsedBytes-t.QuotaBytes
		case t.QuotaBytes == 0:
			amount = t.UsedBytes
		default:
			continue // within its guarantee
		}
		if best < 0 || (over && !bestOver) || (over == bestOver && amount > bestUsed) {
			best, bestOver, bestUsed = j, over, amount
		}
	}
	return best, best >= 0
}

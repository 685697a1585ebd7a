package metadata

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvpool/kvpool/api"
)

// Policies stores per-tenant policy records in etcd under
// <prefix>policies/<tenant>, as JSON, with no lease: they outlive every
// node. This package only stores them; the eviction layer defines and
// validates their content.
type Policies struct {
	kv   clientv3.KV
	keys keys
}

// NewPolicies uses kv under prefix (default "/kvpool/").
func NewPolicies(kv clientv3.KV, prefix string) *Policies {
	if prefix == "" {
		prefix = "/kvpool/"
	}
	return &Policies{kv: kv, keys: keys{prefix}}
}

// Put stores tenant's policy. policy must be valid JSON.
func (p *Policies) Put(ctx context.Context, tenant string, policy []byte) error {
	if err := api.ValidateName("tenant", tenant); err != nil {
		return err
	}
	if !json.Valid(policy) {
		return fmt.Errorf("%w: policy for %s is not valid JSON", api.ErrInvalidArgument, tenant)
	}
	if _, err := p.kv.Put(ctx, p.keys.policy(tenant), string(policy)); err != nil {
		return fmt.Errorf("%w: metadata: put policy: %v", api.ErrUnavailable, err)
	}
	return nil
}

// Get returns tenant's policy, or api.ErrNotFound.
func (p *Policies) Get(ctx context.Context, tenant string) ([]byte, error) {
	if err := api.ValidateName("tenant", tenant); err != nil {
		return nil, err
	}
	resp, err := p.kv.Get(ctx, p.keys.policy(tenant))
	if err != nil {
		return nil, fmt.Errorf("%w: metadata: get policy: %v", api.ErrUnavailable, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, fmt.Errorf("%w: no policy for tenant %s", api.ErrNotFound, tenant)
	}
	return resp.Kvs[0].Value, nil
}

// List returns every tenant's policy.
func (p *Policies) List(ctx context.Context) (map[string][]byte, error) {
	resp, err := p.kv.Get(ctx, p.keys.policies(), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("%w: metadata: list policies: %v", api.ErrUnavailable, err)
	}
	out := map[string][]byte{}
	for _, kv := range resp.Kvs {
		out[strings.TrimPrefix(string(kv.Key), p.keys.policies())] = kv.Value
	}
	return out, nil
}

// Delete removes tenant's policy; deleting a missing one is not an error.
func (p *Policies) Delete(ctx context.Context, tenant string) error {
	if err := api.ValidateName("tenant", tenant); err != nil {
		return err
	}
	if _, err := p.kv.Delete(ctx, p.keys.policy(tenant)); err != nil {
		return fmt.Errorf("%w: metadata: delete policy: %v", api.ErrUnavailable, err)
	}
	return nil
}

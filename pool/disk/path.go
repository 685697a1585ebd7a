package disk

import "path/filepath"

// Path returns the file that holds the block under the name, and whether
// the tier holds it: for operators and tests that look at the files.
func (t *Tier) Path(tenantName, namespace, key []byte) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	b, ok := t.lookupLocked(tenantName, namespace, key)
	if !ok {
		return "", false
	}
	return filepath.Join(t.blocks, b.path), true
}

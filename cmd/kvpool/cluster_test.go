package main

import (
	"bytes"
	"testing"

	"github.com/kvpool/kvpool/api/admin"
)

// The locate table shows each tier: '#' for blocks in GPU memory, '+'
// for those only in host memory, '.' for those only on disk, '-' where
// the GPU tier is not followed, '?' where the node did not say.
func TestPrintLocateShowsTiers(t *testing.T) {
	loc := admin.Location{ChainBlocks: 4, DeepestBlocks: 2, DeepestNodes: []string{"node-1"}, PoolPrefixBlocks: 2, Nodes: []admin.NodePrefix{
		{Node: "node-0", GPUBlocks: 4, GPUFollowed: true},
		{Node: "node-1", Blocks: 2, GPUBlocks: 1, GPUFollowed: true},
		{Node: "node-3", Blocks: 4, MemoryBlocks: 1, TiersKnown: true},
		{Node: "node-2"},
	}}
	var b bytes.Buffer
	printLocate(&b, &loc)
	want := `NODE    GPU  HOST  DISK  OF 4
node-0  4    0     ?     ##############################
node-1  1    2     ?     #######++++++++
node-3  -    1     3     +++++++.......................
node-2  -    0     ?     
deepest prefix: 2 blocks on node-1
held anywhere in the pool: 2 leading blocks
`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}

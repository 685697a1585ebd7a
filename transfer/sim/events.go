package sim

import "container/heap"

// Event is something that happens at a simulated time.
type Event struct {
	// AtS is when, in simulated seconds.
	AtS float64
	// Kind and Arg say what; the simulator's loop interprets them.
	Kind int
	Arg  int
	seq  uint64
}

// Queue is the simulator's event queue: events come out by time, and
// events at the same time in the order they were pushed, so a run is the
// same every time. Not safe for concurrent use (nothing here is).
type Queue struct {
	h    eventHeap
	next uint64
}

// Push schedules e.
func (q *Queue) Push(e Event) {
	e.seq = q.next
	q.next++
	heap.Push(&q.h, e)
}

// Pop removes and returns the earliest event; ok is false when the queue
// is empty.
func (q *Queue) Pop() (e Event, ok bool) {
	if len(q.h) == 0 {
		return Event{}, false
	}
	return heap.Pop(&q.h).(Event), true
}

// Len is how many events wait.
func (q *Queue) Len() int { return len(q.h) }

type eventHeap []Event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].AtS != h[j].AtS {
		return h[i].AtS < h[j].AtS
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(Event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

package api

import "net/http"

// QueuePause is a queue's pause on one shard: when and by whom.
type QueuePause struct {
	At Time   `json:"at"`
	By string `json:"by"`
}

// QueuePauseShard is one shard's part of a pause or resume.
type QueuePauseShard struct {
	ShardOutcome
	// Paused is the queue's pause on the shard after the call (nil: it
	// runs); Changed says whether this call changed it.
	Paused  *QueuePause `json:"paused"`
	Changed bool        `json:"changed"`
}

// QueuePauseResult is the answer to POST /v1/queues/{queue}/pause and
// /resume.
type QueuePauseResult struct {
	Queue string `json:"queue"`
	// Paused is what was asked: true for a pause, false for a resume.
	Paused bool              `json:"paused"`
	Shards []QueuePauseShard `json:"shards"`
	// UnavailableShards did not take the change: send it again.
	UnavailableShards []int `json:"unavailable_shards"`
}

// Status is 200 when every shard took the change, 207 when some did, 503
// when none did.
func (r QueuePauseResult) Status() int {
	ok := 0
	for _, s := range r.Shards {
		if s.Outcome == ShardOutcomeOK {
			ok++
		}
	}
	switch {
	case ok == len(r.Shards):
		return http.StatusOK
	case ok > 0:
		return http.StatusMultiStatus
	}
	return http.StatusServiceUnavailable
}

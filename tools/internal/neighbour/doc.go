// Package neighbour measures the noisy neighbour of docs/fairness.md
// against a running gateway (harvest-bench neighbour): one tenant floods a
// queue with runs at a high priority while another starts a plain run at a
// steady pace, and the second tenant's wait from start to claim is what a
// neighbour's priority costs it.
//
// It brings no fleet of its own: it talks to the gateway that
// `harvest dev --env-file` describes, with that file's tenant and
// administrator tokens, so that what it measures is what a user of the
// defaults meets.
package neighbour

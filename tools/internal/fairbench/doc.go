// Package fairbench measures the two fairness modes of a queue on a small
// fleet: worker loops that claim batches for their free slots with the
// fair claim of pkg/claim, hold each task for its tenant's duration and
// complete it, against a fresh database. It reports the tenants' shares
// of the claims and of the worker time over a window, with each mode off
// and on, and draws them.
package fairbench

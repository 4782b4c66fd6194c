package telemetry

import (
	"strconv"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// The pools and NATS connections whose statistics /metrics shows. They are
// kept for the whole process rather than in one registry: every registry
// Setup makes reads the same sets, so registering before or after a Setup
// (or across the several Setup calls of a test process) makes no
// difference.
var stats struct {
	mu    sync.Mutex
	next  uint64
	pools map[uint64]shardPool
	conns map[uint64]*nats.Conn
}

type shardPool struct {
	shard string
	pool  *pgxpool.Pool
}

// RegisterPool adds the statistics of pool, a pool of shard's database, to
// /metrics (the harvest_pgx_pool_* series, labelled by shard). Pools of
// the same shard (a gateway and a worker in one process) are added up.
// Call unregister before closing the pool.
func RegisterPool(shard int, pool *pgxpool.Pool) (unregister func()) {
	stats.mu.Lock()
	defer stats.mu.Unlock()
	if stats.pools == nil {
		stats.pools = map[uint64]shardPool{}
	}
	id := stats.next
	stats.next++
	stats.pools[id] = shardPool{shard: strconv.Itoa(shard), pool: pool}
	return sync.OnceFunc(func() {
		stats.mu.Lock()
		delete(stats.pools, id)
		stats.mu.Unlock()
	})
}

// RegisterNATS adds the statistics of nc to /metrics (the harvest_nats_*
// series). The connections of one process are added up: their number is
// small and fixed, and a label per connection would say nothing an
// operator acts on. Call unregister when the connection is closed.
func RegisterNATS(nc *nats.Conn) (unregister func()) {
	stats.mu.Lock()
	defer stats.mu.Unlock()
	if stats.conns == nil {
		stats.conns = map[uint64]*nats.Conn{}
	}
	id := stats.next
	stats.next++
	stats.conns[id] = nc
	return sync.OnceFunc(func() {
		stats.mu.Lock()
		delete(stats.conns, id)
		stats.mu.Unlock()
	})
}

func poolDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc("harvest_pgx_pool_"+name, help, []string{"shard"}, nil)
}

// poolMetric is one series of the pool collector: how to read it from a
// pool's statistics, and whether it is a counter.
type poolMetric struct {
	desc    *prometheus.Desc
	counter bool
	value   func(*pgxpool.Stat) float64
}

var poolMetrics = []poolMetric{
	{poolDesc("acquired_connections", "Connections of the pool in use."), false,
		func(s *pgxpool.Stat) float64 { return float64(s.AcquiredConns()) }},
	{poolDesc("idle_connections", "Connections of the pool ready for use."), false,
		func(s *pgxpool.Stat) float64 { return float64(s.IdleConns()) }},
	{poolDesc("constructing_connections", "Connections of the pool being opened."), false,
		func(s *pgxpool.Stat) float64 { return float64(s.ConstructingConns()) }},
	{poolDesc("total_connections", "Connections of the pool: acquired, idle and being opened."), false,
		func(s *pgxpool.Stat) float64 { return float64(s.TotalConns()) }},
	{poolDesc("max_connections", "Largest number of connections the pool opens."), false,
		func(s *pgxpool.Stat) float64 { return float64(s.MaxConns()) }},
	{poolDesc("acquires_total", "Connections acquired from the pool."), true,
		func(s *pgxpool.Stat) float64 { return float64(s.AcquireCount()) }},
	{poolDesc("acquire_duration_seconds_total", "Time spent acquiring connections from the pool."), true,
		func(s *pgxpool.Stat) float64 { return s.AcquireDuration().Seconds() }},
	{poolDesc("empty_acquires_total", "Acquires that had to wait because no connection was idle."), true,
		func(s *pgxpool.Stat) float64 { return float64(s.EmptyAcquireCount()) }},
	{poolDesc("empty_acquire_wait_seconds_total", "Time acquires waited because no connection was idle."), true,
		func(s *pgxpool.Stat) float64 { return s.EmptyAcquireWaitTime().Seconds() }},
	{poolDesc("canceled_acquires_total", "Acquires given up because their context ended."), true,
		func(s *pgxpool.Stat) float64 { return float64(s.CanceledAcquireCount()) }},
	{poolDesc("new_connections_total", "Connections the pool opened."), true,
		func(s *pgxpool.Stat) float64 { return float64(s.NewConnsCount()) }},
	{poolDesc("max_lifetime_destroyed_connections_total", "Connections closed for reaching their maximum lifetime."), true,
		func(s *pgxpool.Stat) float64 { return float64(s.MaxLifetimeDestroyCount()) }},
	{poolDesc("max_idle_destroyed_connections_total", "Connections closed for staying idle too long."), true,
		func(s *pgxpool.Stat) float64 { return float64(s.MaxIdleDestroyCount()) }},
}

// poolCollector serves the statistics of the pools of RegisterPool. The
// statistics are read at scrape time, so /metrics is never out of date and
// nothing runs between scrapes.
type poolCollector struct{}

func (poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range poolMetrics {
		ch <- m.desc
	}
}

func (poolCollector) Collect(ch chan<- prometheus.Metric) {
	stats.mu.Lock()
	pools := make([]shardPool, 0, len(stats.pools))
	for _, p := range stats.pools {
		pools = append(pools, p)
	}
	stats.mu.Unlock()
	// Stat takes the pool's lock, so it is read outside stats.mu.
	sums := map[string][]float64{}
	for _, p := range pools {
		st := p.pool.Stat()
		sum := sums[p.shard]
		if sum == nil {
			sum = make([]float64, len(poolMetrics))
			sums[p.shard] = sum
		}
		for i, m := range poolMetrics {
			sum[i] += m.value(st)
		}
	}
	for shard, sum := range sums {
		for i, m := range poolMetrics {
			typ := prometheus.GaugeValue
			if m.counter {
				typ = prometheus.CounterValue
			}
			ch <- prometheus.MustNewConstMetric(m.desc, typ, sum[i], shard)
		}
	}
}

func natsDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc("harvest_nats_"+name, help, nil, nil)
}

var (
	natsConnected   = natsDesc("connected_connections", "NATS connections of the process that are connected now.")
	natsInMessages  = natsDesc("received_messages_total", "Messages received over NATS.")
	natsOutMessages = natsDesc("sent_messages_total", "Messages sent over NATS.")
	natsInBytes     = natsDesc("received_bytes_total", "Bytes of message data received over NATS.")
	natsOutBytes    = natsDesc("sent_bytes_total", "Bytes of message data sent over NATS.")
	natsReconnects  = natsDesc("reconnects_total", "Reconnections to a NATS server.")
)

// natsCollector serves the statistics of the connections of RegisterNATS.
type natsCollector struct{}

func (natsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{natsConnected, natsInMessages, natsOutMessages, natsInBytes, natsOutBytes, natsReconnects} {
		ch <- d
	}
}

func (natsCollector) Collect(ch chan<- prometheus.Metric) {
	stats.mu.Lock()
	conns := make([]*nats.Conn, 0, len(stats.conns))
	for _, nc := range stats.conns {
		conns = append(conns, nc)
	}
	stats.mu.Unlock()
	if len(conns) == 0 {
		return
	}
	var sum nats.Statistics
	connected := 0
	for _, nc := range conns {
		s := nc.Stats()
		sum.InMsgs += s.InMsgs
		sum.OutMsgs += s.OutMsgs
		sum.InBytes += s.InBytes
		sum.OutBytes += s.OutBytes
		sum.Reconnects += s.Reconnects
		if nc.IsConnected() {
			connected++
		}
	}
	ch <- prometheus.MustNewConstMetric(natsConnected, prometheus.GaugeValue, float64(connected))
	ch <- prometheus.MustNewConstMetric(natsInMessages, prometheus.CounterValue, float64(sum.InMsgs))
	ch <- prometheus.MustNewConstMetric(natsOutMessages, prometheus.CounterValue, float64(sum.OutMsgs))
	ch <- prometheus.MustNewConstMetric(natsInBytes, prometheus.CounterValue, float64(sum.InBytes))
	ch <- prometheus.MustNewConstMetric(natsOutBytes, prometheus.CounterValue, float64(sum.OutBytes))
	ch <- prometheus.MustNewConstMetric(natsReconnects, prometheus.CounterValue, float64(sum.Reconnects))
}

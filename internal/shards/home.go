package shards

import (
	"encoding/binary"
	"hash/fnv"
)

// Home returns the index of the home shard of tenant among n shards; n must
// be at least 1. The choice depends only on the tenant and n, so every
// gateway and CLI agrees on it without coordination.
func Home(tenant string, n int) int {
	if n <= 1 {
		return 0
	}
	best, bestScore := 0, uint64(0)
	for i := 0; i < n; i++ {
		if s := score(tenant, i); i == 0 || s > bestScore {
			best, bestScore = i, s
		}
	}
	return best
}

// score hashes (tenant, shard) with FNV-1a and a final mix, so that scores of
// one tenant across shards are independent enough for rendezvous hashing.
func score(tenant string, shard int) uint64 {
	h := fnv.New64a()
	h.Write([]byte(tenant))
	var b [9]byte
	b[0] = 0 // separator: no tenant name holds a NUL byte
	binary.BigEndian.PutUint64(b[1:], uint64(shard))
	h.Write(b[:])
	return mix(h.Sum64())
}

// mix is the splitmix64 finaliser; FNV alone leaves low-entropy high bits for
// short inputs that differ only in their last bytes.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

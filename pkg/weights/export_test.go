package weights

// MapError exposes the error mapping to the external tests.
var MapError = mapError

// KeysOwned exposes the per-key view of one shard limited to a tenant's
// keys, so that a test can read it inside its own transaction.
var KeysOwned = keysOne

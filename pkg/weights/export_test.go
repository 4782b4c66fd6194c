package weights

// MapError exposes the error mapping to the external tests.
var MapError = mapError

package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
)

// SecretPrefix starts every secret NewSecret makes, so that a leaked
// Harvest token is easy to recognise (in logs, in secret scanners).
const SecretPrefix = "hv_"

// secretBytes is the entropy of a new secret.
const secretBytes = 32

// HashSecret returns the lower-case hex SHA-256 of secret: the value a
// tokens file stores in its "sha256" field.
func HashSecret(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// NewSecret makes a new random bearer secret: SecretPrefix followed by 32
// bytes from crypto/rand in unpadded URL-safe base64 (46 characters in all).
func NewSecret() (string, error) {
	b := make([]byte, secretBytes)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("auth: new secret: %w", err)
	}
	return SecretPrefix + base64.RawURLEncoding.EncodeToString(b), nil
}

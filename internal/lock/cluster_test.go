package lock_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/lock"
)

// hashTag returns the part of key Redis Cluster hashes: the content of the
// first {…} if it is non-empty, else the whole key.
func hashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

// slot is Redis Cluster's key slot: CRC16-XMODEM of the hash tag mod 16384.
func slot(key string) uint16 {
	var crc uint16
	for _, b := range []byte(hashTag(key)) {
		crc ^= uint16(b) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % 16384
}

func TestRedisKeysShareClusterSlot(t *testing.T) {
	t.Parallel()

	// The reference value from the Redis Cluster specification.
	require.Equal(t, uint16(12739), slot("123456789"))

	for _, key := range []string{
		"a",
		"inboxmq:lock:payments:order-42",
		"has{braces}inside",
		"{already-tagged}:x",
		"trailing}",
		"ünïcödé:キー",
	} {
		lockKey, fenceKey := lock.RedisKeys(key)
		require.NotEqual(t, lockKey, fenceKey)
		require.NotEmpty(t, hashTag(lockKey), key)
		require.Equal(t, hashTag(lockKey), hashTag(fenceKey), key)
		require.Equal(t, slot(lockKey), slot(fenceKey), key)
	}
}

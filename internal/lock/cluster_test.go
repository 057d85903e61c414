package lock_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/lock"
	"github.com/inboxmq/inboxmq/internal/redistest"
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

// On a real Redis Cluster (one node owning every slot, which refuses a
// script whose keys hash to different slots just as a larger cluster does):
// the server's CLUSTER KEYSLOT agrees with slot above for both keys of
// every lock, including the middleware's "<prefix><consumer>:<key>" names,
// and every script of the lock (obtain with its fence, refresh, release)
// runs there.
func TestLockOnRedisCluster(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	node := redistest.StartCluster(t)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{node.Addr()}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })

	// The cluster enforces one slot per script: keys without a shared
	// hash tag are refused.
	err := rdb.Eval(ctx, `return redis.call("MGET", KEYS[1], KEYS[2])`, []string{"lock-a", "lock-b"}).Err()
	require.ErrorContains(t, err, "CROSSSLOT")

	names := []string{
		"a", "inboxmq:lock:payments:order-42", "has{braces}inside", "{already-tagged}:x", "trailing}",
		"ünïcödé:キー", "inboxmq:lock:payments:{order}:7",
	}
	for _, name := range names {
		lockKey, fenceKey := lock.RedisKeys(name)
		ls, err := rdb.ClusterKeySlot(ctx, lockKey).Result()
		require.NoError(t, err)
		fs, err := rdb.ClusterKeySlot(ctx, fenceKey).Result()
		require.NoError(t, err)
		require.Equal(t, ls, fs, name)
		require.Equal(t, int64(slot(lockKey)), ls, name)
	}

	for _, name := range names {
		key := t.Name() + ":" + name
		l, err := lock.Obtain(ctx, rdb, key, 10*time.Second, time.Second)
		require.NoError(t, err, name)
		require.NoError(t, l.Refresh(ctx), name)
		_, err = lock.Obtain(ctx, rdb, key, 10*time.Second, 0)
		require.ErrorIs(t, err, lock.ErrNotObtained, name)
		require.NoError(t, l.Release(ctx), name)

		l2, err := lock.Obtain(ctx, rdb, key, 10*time.Second, 0)
		require.NoError(t, err, name)
		require.Greater(t, l2.Fence(), l.Fence(), name)
		require.NoError(t, l2.Release(ctx), name)
	}
}

-- Prefix of release.lua for Batcher.ReleaseAndMark. KEYS[2]: the mark, of
-- the lock's hash tag; ARGV[2]: its value; ARGV[3]: its TTL in ms. The mark
-- is written whether or not the lock is still held; release.lua below then
-- deletes the lock only if it holds the token.
redis.call("SET", KEYS[2], ARGV[2], "PX", ARGV[3])

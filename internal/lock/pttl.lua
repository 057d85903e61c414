-- KEYS[1]: the lock key; ARGV[1]: token. Returns the remaining TTL in ms,
-- or -3 when the key does not hold the token.
if redis.call("GET", KEYS[1]) == ARGV[1] then
	return redis.call("PTTL", KEYS[1])
end
return -3

-- KEYS[1]: the lock key; ARGV[1]: token; ARGV[2]: TTL in ms. Extends the
-- key only if it holds the token. Returns 1 when extended, 0 otherwise.
if redis.call("GET", KEYS[1]) == ARGV[1] then
	return redis.call("PEXPIRE", KEYS[1], ARGV[2])
end
return 0

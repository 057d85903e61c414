-- KEYS[1]: the lock key; ARGV[1]: token. Deletes the key only if it holds
-- the token. Returns 1 when deleted, 0 when the lock was not held.
if redis.call("GET", KEYS[1]) == ARGV[1] then
	return redis.call("DEL", KEYS[1])
end
return 0

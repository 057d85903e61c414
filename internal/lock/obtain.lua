-- KEYS[1]: the lock key; KEYS[2]: its fencing counter (same hash tag).
-- ARGV[1]: token; ARGV[2]: TTL in ms; ARGV[3]: the fence's TTL in ms.
-- Returns the new fencing token (> 0), or, when the lock is held by
-- another, minus the holder's remaining TTL in ms (0: no expiry).
if not redis.call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then
	local ttl = redis.call("PTTL", KEYS[1])
	if ttl == -1 then
		return 0
	end
	return -math.max(ttl, 1)
end
local fence = redis.call("INCR", KEYS[2])
redis.call("PEXPIRE", KEYS[2], ARGV[3])
return fence

-- KEYS[1]: the lock key; KEYS[2]: its fencing counter (same hash tag).
-- ARGV[1]: token; ARGV[2]: TTL in ms; ARGV[3]: fence TTL in ms (0 = none).
-- Returns the new fencing token, or 0 when the lock is held by another.
if not redis.call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then
	return 0
end
local fence = redis.call("INCR", KEYS[2])
if tonumber(ARGV[3]) > 0 then
	redis.call("PEXPIRE", KEYS[2], ARGV[3])
end
return fence

-- GCRA with reservation: one call takes the next free slot of the limit.
-- KEYS[1]: the limiter's key; its value is the theoretical arrival time
-- (TAT) in microseconds since the epoch of Redis's clock.
-- ARGV[1]: emission interval in µs (period / rate);
-- ARGV[2]: burst tolerance in µs (interval × (burst − 1));
-- ARGV[3]: the longest wait the caller accepts, in µs.
-- Returns {1, wait µs} when a slot was reserved (the call may run after
-- wait), or {0, wait µs} when the next slot is further away than ARGV[3]
-- (nothing reserved).
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local tat = tonumber(redis.call("GET", KEYS[1]) or 0)
if tat < now then
	tat = now
end
local wait = tat - tonumber(ARGV[2]) - now
if wait < 0 then
	wait = 0
end
if wait > tonumber(ARGV[3]) then
	return {0, string.format("%.0f", wait)}
end
local next_tat = tat + interval
redis.call("SET", KEYS[1], string.format("%.0f", next_tat), "PX", math.floor((next_tat - now) / 1000) + 1000)
return {1, string.format("%.0f", wait)}

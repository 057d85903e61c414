-- Prefix of obtain.lua for Batcher.ObtainUnlessMarked. KEYS[3]: the mark,
-- of the lock's hash tag; ARGV[4]: the value that makes it a hit. When the
-- mark holds that value, no lock is taken and the script returns "marked";
-- otherwise obtain.lua below runs unchanged.
if redis.call("GET", KEYS[3]) == ARGV[4] then
	return "marked"
end

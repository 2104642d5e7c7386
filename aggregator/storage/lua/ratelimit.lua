-- Count one request against a fixed-window rate limit (the same counting as ingest.lua's).
--
-- KEYS[1] the counter of one client, one limited view and one window (no hash tag: one
-- key per call, so the call goes to that key's own cluster slot)
-- ARGV[1] the window's length in seconds
--
-- Returns {hits, ttl}: the window's requests so far, this one included, and the seconds
-- left until the counter expires with its window.
local hits = redis.call('INCR', KEYS[1])
if hits == 1 then
  redis.call('EXPIRE', KEYS[1], ARGV[1])
end
return {hits, redis.call('TTL', KEYS[1])}

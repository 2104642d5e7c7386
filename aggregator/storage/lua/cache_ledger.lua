-- The estimate cache's size over every campaign, in one slot, so that one cap holds across
-- processes and a cluster's masters: set the sizes of some entries unless that would take
-- the total past the cap. Expired entries are dropped from the count first (their bodies
-- expire on their own, at the same moment).
--
-- KEYS[1] every entry by expiry (sorted set: entry key -> unix ms)
-- KEYS[2] every entry's size (hash: entry key -> bytes)   KEYS[3] their total (string)
-- ARGV[1] now (unix ms)   ARGV[2] the cap in bytes (-1: no check)
-- ARGV[3..] triples of distinct entries: entry key, its bytes (0: forget it), its expiry
--
-- Returns {set, total}: 1 if the sizes were set, 0 if the total would have passed the cap
-- (nothing set; a change that does not raise the total is always made), and the total now.
local now, cap = tonumber(ARGV[1]), tonumber(ARGV[2])
local total = tonumber(redis.call('GET', KEYS[3]) or '0')
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
for _, key in ipairs(expired) do
  total = total - tonumber(redis.call('HGET', KEYS[2], key) or '0')
  redis.call('HDEL', KEYS[2], key)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)

local after = total
for i = 3, #ARGV, 3 do
  after = after - tonumber(redis.call('HGET', KEYS[2], ARGV[i]) or '0') + tonumber(ARGV[i + 1])
end
local set = 1
if cap >= 0 and after > cap and after > total then
  set, after = 0, total
else
  for i = 3, #ARGV, 3 do
    if tonumber(ARGV[i + 1]) > 0 then
      redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
      redis.call('ZADD', KEYS[1], ARGV[i + 2], ARGV[i])
    else
      redis.call('HDEL', KEYS[2], ARGV[i])
      redis.call('ZREM', KEYS[1], ARGV[i])
    end
  end
end

local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')[2]
if last then
  redis.call('SET', KEYS[3], after)
  redis.call('PEXPIREAT', KEYS[1], last)
  redis.call('PEXPIREAT', KEYS[2], last)
  redis.call('PEXPIREAT', KEYS[3], last)
else
  redis.call('DEL', KEYS[2], KEYS[3])
end
return {set, after}

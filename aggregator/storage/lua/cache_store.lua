-- Keep one estimate body in its campaign's share of the estimate cache, atomically in the
-- campaign's slot: drop the campaign's expired entries and the body's stale predecessor,
-- evict the campaign's least recently computed entries until the body fits under the
-- campaign's cap, write it with its expiry and record the memory it takes.
--
-- KEYS[1] the campaign's entries by expiry (sorted set: entry key -> unix ms)
-- KEYS[2] the campaign's entries' sizes (hash: entry key -> bytes)
-- KEYS[3] the entry (hash: counts_digest, body and maybe reports)
-- ARGV[1] now (unix ms)   ARGV[2] the campaign's cap in bytes
-- ARGV[3] the bytes reserved for the entry (the most it may take)
-- ARGV[4] the entry's expiry (unix ms)   ARGV[5] bytes of bookkeeping per entry
-- ARGV[6] 1 to write the entry, 0 only to drop what the key held
-- ARGV[7..] the entry's fields and values
--
-- Entry keys other than KEYS[3] come from the campaign's own sorted set: they share its
-- hash tag, so they are in its slot. Returns {stored, bytes, dropped...}: stored 1 or 0;
-- the bytes the entry takes (its MEMORY USAGE plus the bookkeeping; 0 unless stored); then
-- the keys of entries that were dropped although not expired (evicted, and with ARGV[6] 0
-- the entry itself if it existed).
local now, cap, reserved = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local expiry, bookkeeping = tonumber(ARGV[4]), tonumber(ARGV[5])

local function forget(key)
  redis.call('DEL', key)
  redis.call('ZREM', KEYS[1], key)
  redis.call('HDEL', KEYS[2], key)
end

for _, key in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
  forget(key)
end
local existed = redis.call('HEXISTS', KEYS[2], KEYS[3]) == 1 or redis.call('EXISTS', KEYS[3]) == 1
forget(KEYS[3])
if ARGV[6] ~= '1' or reserved > cap then
  if existed then
    return {0, 0, KEYS[3]}
  end
  return {0, 0}
end

local used = 0
for _, size in ipairs(redis.call('HVALS', KEYS[2])) do
  used = used + tonumber(size)
end
local dropped = {}
while used + reserved > cap do
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
  if not oldest then
    return {0, 0, unpack(dropped)}
  end
  used = used - tonumber(redis.call('HGET', KEYS[2], oldest) or '0')
  forget(oldest)
  dropped[#dropped + 1] = oldest
end

redis.call('HSET', KEYS[3], unpack(ARGV, 7))
redis.call('PEXPIREAT', KEYS[3], expiry)
-- What Redis allocated for it, allocator rounding included; without MEMORY (renamed or
-- disabled), the reservation stands.
local measured, usage = pcall(redis.call, 'MEMORY', 'USAGE', KEYS[3], 'SAMPLES', 0)
local bytes = reserved
if measured and usage then
  bytes = usage + bookkeeping
end
if bytes > reserved then
  forget(KEYS[3])
  return {0, 0, unpack(dropped)}
end
redis.call('ZADD', KEYS[1], expiry, KEYS[3])
redis.call('HSET', KEYS[2], KEYS[3], bytes)
local last = tonumber(redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')[2])
redis.call('PEXPIREAT', KEYS[1], last)
redis.call('PEXPIREAT', KEYS[2], last)
return {1, bytes, unpack(dropped)}

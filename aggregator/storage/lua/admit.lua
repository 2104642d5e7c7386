-- Admit one submission to a campaign: count it against the client's rate limit, and reserve
-- its reports in the client's report budget and in the campaign's quota, atomically. The
-- caller gives back what was not stored (duplicates, refusals) with release.lua.
--
-- KEYS[1] the client's submissions counter for this window
-- KEYS[2] the client's new-reports counter for its budget window
-- KEYS[3] the campaign's admitted reports (stored, plus reserved by submissions in flight)
-- ARGV[1] submissions allowed per window (0: no limit, or the submission is counted already)
-- ARGV[2] its window in seconds   ARGV[3] reports allowed per budget window (0: no budget)
-- ARGV[4] its window in seconds   ARGV[5] most reports the campaign may hold (0: no quota)
-- ARGV[6] the reports to reserve
--
-- Returns {status, hits, ttl}: status ADMITTED, RATE_LIMITED, OVER_BUDGET or OVER_QUOTA
-- (nothing reserved; a refused submission is still counted); `hits` is this window's
-- submissions so far and `ttl` the seconds left in the window that refused, or in the
-- submissions window (both 0 without a limit). Fixed windows count as ratelimit.lua does.
-- Status codes (aggregator.storage.store.IngestStatus has the same names and values).
local ADMITTED, RATE_LIMITED, OVER_BUDGET, OVER_QUOTA = 0, 5, 6, 7
local hits, ttl = 0, 0
local limit = tonumber(ARGV[1])
if limit > 0 then
  hits = redis.call('INCR', KEYS[1])
  if hits == 1 then
    redis.call('EXPIRE', KEYS[1], ARGV[2])
  end
  ttl = redis.call('TTL', KEYS[1])
  if hits > limit then
    return {RATE_LIMITED, hits, ttl}
  end
end
local wanted = tonumber(ARGV[6])
local budget = tonumber(ARGV[3])
if budget > 0 and tonumber(redis.call('GET', KEYS[2]) or '0') + wanted > budget then
  local budget_ttl = redis.call('TTL', KEYS[2])
  if budget_ttl < 0 then
    budget_ttl = tonumber(ARGV[4])
  end
  return {OVER_BUDGET, hits, budget_ttl}
end
local quota = tonumber(ARGV[5])
if quota > 0 and tonumber(redis.call('GET', KEYS[3]) or '0') + wanted > quota then
  return {OVER_QUOTA, hits, ttl}
end
if wanted > 0 then
  if budget > 0 and redis.call('INCRBY', KEYS[2], wanted) == wanted then
    redis.call('EXPIRE', KEYS[2], ARGV[4])
  end
  redis.call('INCRBY', KEYS[3], wanted)
end
return {ADMITTED, hits, ttl}

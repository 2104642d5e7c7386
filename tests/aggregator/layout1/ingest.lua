-- Ingest a batch of validated reports into one campaign, atomically.
--
-- KEYS[1] campaign hash   KEYS[2] counts hash   KEYS[3] hourly counts hash
-- KEYS[4] report stream   KEYS[5] unused enrollment tokens (set of SHA-256 hex digests)
-- KEYS[6] rate-limit counter of this client and window (submissions)
-- KEYS[7] report-budget counter of this client and window (new reports)
-- KEYS[8..] one "seen" key per report (report id dedupe): a common prefix, then the id
-- ARGV[1] dedupe retention in seconds   ARGV[2] hour bucket (unix seconds)
-- ARGV[3] 1 if the campaign requires enrollment, else 0
-- ARGV[4] retention: stream entries older than this id (unix ms) are trimmed; 0 keeps all
-- ARGV[5] the spec hash the reports were validated against ('' to skip the check)
-- ARGV[6] submissions allowed per window (0: no limit)   ARGV[7] window in seconds
-- ARGV[8] new reports allowed per budget window (0: no budget)   ARGV[9] its window in s
-- ARGV[10] most reports the campaign may hold (0: no quota)
-- ARGV[11] length of the seen keys' prefix (the report id is the rest of the key)
-- ARGV[12] the number D of distinct outputs in the batch, then D pairs (output index,
-- value JSON); then per report: its output index and, only if ARGV[3] is 1, its token digest
--
-- Returns {status, accepted, duplicates, index, hits, ttl}; status STORED, NO_CAMPAIGN,
-- CLOSED, NO_TOKEN (report number `index` (1-based) has no unused enrollment token),
-- SPEC_CHANGED (the campaign's spec hash is not ARGV[5]: validated against a spec no longer
-- stored), RATE_LIMITED, OVER_BUDGET (the new reports would overdraw the client's report
-- budget; `ttl`: seconds left in the budget window) or OVER_QUOTA (they would take the
-- campaign past its quota). `hits` is this window's submissions so far and `ttl` the
-- seconds left in it (both 0 without a limit). Nothing is written unless the status is STORED,
-- except the rate-limit counter (all statuses but NO_CAMPAIGN and SPEC_CHANGED). A report id already stored is
-- a duplicate whatever its token (a retry must not be refused because its token was spent
-- by itself), and duplicates count against neither the budget nor the quota.
-- Status codes (aggregator.storage.store.IngestStatus has the same names and values).
local STORED, NO_CAMPAIGN, CLOSED, NO_TOKEN, SPEC_CHANGED = 0, 1, 2, 3, 4
local RATE_LIMITED, OVER_BUDGET, OVER_QUOTA = 5, 6, 7

local meta = redis.call('HMGET', KEYS[1], 'status', 'spec_hash')
local status = meta[1]
if not status then
  return {NO_CAMPAIGN, 0, 0, 0, 0, 0}
end
if ARGV[5] ~= '' and meta[2] ~= ARGV[5] then
  return {SPEC_CHANGED, 0, 0, 0, 0, 0}
end
local limit = tonumber(ARGV[6])
local hits, window_ttl = 0, 0
if limit > 0 then
  hits = redis.call('INCR', KEYS[6])
  if hits == 1 then
    redis.call('EXPIRE', KEYS[6], ARGV[7])
  end
  window_ttl = redis.call('TTL', KEYS[6])
  if hits > limit then
    return {RATE_LIMITED, 0, 0, 0, hits, window_ttl}
  end
end
if status ~= 'open' then
  return {CLOSED, 0, 0, 0, hits, window_ttl}
end
local ttl = ARGV[1]
local hour = ARGV[2]
local enrollment = ARGV[3] == '1'
local min_id = tonumber(ARGV[4])
local n = #KEYS - 7
local stride = enrollment and 2 or 1
local id_from = tonumber(ARGV[11]) + 1
local values = {}
local n_values = tonumber(ARGV[12])
for v = 0, n_values - 1 do
  values[ARGV[13 + 2 * v]] = ARGV[14 + 2 * v]
end
local first = 13 + 2 * n_values

-- The batch's reports not stored yet (distinct ids without a dedupe key): counted only
-- when the batch's size alone would overdraw the budget or the quota.
local fresh = nil
local function count_fresh()
  if not fresh then
    local ids = {}
    fresh = 0
    for r = 1, n do
      local key = KEYS[7 + r]
      if not ids[key] then
        ids[key] = true
        if redis.call('EXISTS', key) == 0 then
          fresh = fresh + 1
        end
      end
    end
  end
  return fresh
end
local budget = tonumber(ARGV[8])
if budget > 0 then
  local spent = tonumber(redis.call('GET', KEYS[7]) or '0')
  if spent + n > budget and spent + count_fresh() > budget then
    local budget_ttl = redis.call('TTL', KEYS[7])
    if budget_ttl < 0 then
      budget_ttl = tonumber(ARGV[9])
    end
    return {OVER_BUDGET, 0, 0, 0, hits, budget_ttl}
  end
end
local quota = tonumber(ARGV[10])
if quota > 0 then
  local stored = tonumber(redis.call('HGET', KEYS[1], 'n_reports') or '0')
  if stored + n > quota and stored + count_fresh() > quota then
    return {OVER_QUOTA, 0, 0, 0, hits, window_ttl}
  end
end

if enrollment then
  local ids, tokens = {}, {}
  for r = 1, n do
    local base = first + stride * (r - 1)
    local id, token = KEYS[7 + r], ARGV[base + 1]
    if not ids[id] and redis.call('EXISTS', KEYS[7 + r]) == 0 then
      ids[id] = true
      if token == '' or tokens[token] or redis.call('SISMEMBER', KEYS[5], token) == 0 then
        return {NO_TOKEN, 0, 0, r, hits, window_ttl}
      end
      tokens[token] = true
    end
  end
end

local accepted = 0
local duplicates = 0
for r = 1, n do
  local base = first + stride * (r - 1)
  if redis.call('SET', KEYS[7 + r], '1', 'NX', 'EX', ttl) then
    local output = ARGV[base]
    if enrollment then
      redis.call('SREM', KEYS[5], ARGV[base + 1])
    end
    redis.call('HINCRBY', KEYS[2], output, 1)
    local report_id = string.sub(KEYS[7 + r], id_from)
    redis.call('XADD', KEYS[4], '*', 'report_id', report_id, 'y', output, 'value', values[output])
    accepted = accepted + 1
  else
    duplicates = duplicates + 1
  end
end
if accepted > 0 then
  if budget > 0 and redis.call('INCRBY', KEYS[7], accepted) == accepted then
    redis.call('EXPIRE', KEYS[7], ARGV[9])
  end
  redis.call('HINCRBY', KEYS[1], 'n_reports', accepted)
  redis.call('HINCRBY', KEYS[3], hour, accepted)
  if min_id > 0 then
    redis.call('XTRIM', KEYS[4], 'MINID', min_id)
  end
end
return {STORED, accepted, duplicates, 0, hits, window_ttl}

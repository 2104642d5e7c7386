-- Admit and ingest the reports of one submission that belong to one shard of a campaign,
-- atomically, in the shard's own slot: the campaign's record is not needed, so a shard
-- whose master is up takes reports while another master fails over.
--
-- KEYS[1] shard state hash (status, spec_hash, n_reports, last_ms)   KEYS[2] counts hash
-- KEYS[3] hourly counts hash   KEYS[4] raw report stream   KEYS[5] unused enrollment tokens
-- KEYS[6] the counts of the period the reports are received in, as a hash, and KEYS[7] as a
-- dense string of 32-bit big-endian counts by output index (aggregator.storage.layout)
-- KEYS[8] the client's submissions counted in this shard in the current rate-limit window
-- KEYS[9] the client's new reports stored in this shard in the current budget window
-- KEYS[10..] deduplication sets, three per bucket the batch touches: the bucket's set in
-- the current window, then in the two windows before (aggregator.storage.layout)
-- ARGV[1] 0 to store; 1 to check only (write nothing but the submission's count); 2 to
-- check only the batch's size against the shares, every report taken as new (no report
-- follows ARGV[17] but their number, and only KEYS[1..9] are given)
-- ARGV[2] the spec hash the reports were validated against ('' to skip the check)
-- ARGV[3] hour bucket (unix seconds)   ARGV[4] now (unix ms)
-- ARGV[5] 1 if the campaign requires enrollment, else 0
-- ARGV[6] 1 to keep raw reports in the stream, else 0
-- ARGV[7] stream entries older than this id (unix ms) are trimmed; 0 keeps all
-- ARGV[8] seconds until the current window's sets expire
-- ARGV[9] seconds until the period's counts expire (0: never)
-- ARGV[10] the number of outputs with reports from which the period's hash becomes dense
-- ARGV[11] the campaign's highest output index
-- ARGV[12] the shard's share of the client's submissions per window (0: no limit, or the
-- submission is counted in another call)   ARGV[13] that window in seconds
-- ARGV[14] the shard's share of the client's new reports per budget window (0: no budget)
-- ARGV[15] that window in seconds   ARGV[16] the shard's share of the campaign's quota (0: none)
-- ARGV[17] the number D of distinct outputs whose wire value follows (0 unless raw reports
-- are kept), then D pairs (output index, value JSON); then per report: its bucket's number
-- b (its sets are KEYS[10 + 3b .. 12 + 3b]), the integer standing for its id, its output
-- index, its token digest (only if ARGV[5] is 1) and its id (only if ARGV[6] is 1)
--
-- Returns {status, accepted, duplicates, index, hits, ttl}: status STORED, NO_CAMPAIGN,
-- CLOSED, NO_TOKEN (report number `index` (1-based, in this shard's list) has no unused
-- enrollment token), SPEC_CHANGED (the shard's spec hash is not ARGV[2]), RATE_LIMITED,
-- OVER_BUDGET (the new reports would overdraw the shard's share of the budget) or
-- OVER_QUOTA (the shard would hold more than its share of the quota). Nothing is written
-- unless the status is STORED (a refused submission is still counted against the rate
-- limit); when checking only, `accepted` is the number of new reports the call would store.
-- `hits` is the submissions counted in this shard's rate-limit window so far and `ttl` the
-- seconds left in it (both 0 when not counted here), or for OVER_BUDGET the seconds left in
-- the budget's window. A report id already stored is a duplicate whatever its token (a
-- retry must not be refused because its token was spent by itself); duplicates cost no
-- budget. Fixed windows count as ratelimit.lua does.
-- Status codes (aggregator.storage.ingest.IngestStatus has the same names and values).
local STORED, NO_CAMPAIGN, CLOSED, NO_TOKEN, SPEC_CHANGED = 0, 1, 2, 3, 4
local RATE_LIMITED, OVER_BUDGET, OVER_QUOTA = 5, 6, 7

local state = redis.call('HMGET', KEYS[1], 'status', 'spec_hash')
if not state[1] then
  return {NO_CAMPAIGN, 0, 0, 0, 0, 0}
end
if ARGV[2] ~= '' and state[2] ~= ARGV[2] then
  return {SPEC_CHANGED, 0, 0, 0, 0, 0}
end
if state[1] ~= 'open' then
  return {CLOSED, 0, 0, 0, 0, 0}
end
local hits, ttl = 0, 0
local limit = tonumber(ARGV[12])
if limit > 0 then
  hits = redis.call('INCR', KEYS[8])
  if hits == 1 then
    redis.call('EXPIRE', KEYS[8], ARGV[13])
  end
  ttl = redis.call('TTL', KEYS[8])
  if hits > limit then
    return {RATE_LIMITED, 0, 0, 0, hits, ttl}
  end
end
local check_only = ARGV[1] ~= '0'
local size_only = ARGV[1] == '2'
local enrollment = ARGV[5] == '1'
local keep = ARGV[6] == '1'
local stride = 3 + (enrollment and 1 or 0) + (keep and 1 or 0)
local values = {}
local n_values = tonumber(ARGV[17])
for v = 0, n_values - 1 do
  values[ARGV[18 + 2 * v]] = ARGV[19 + 2 * v]
end
local first = 18 + 2 * n_values
local n = (#ARGV - first + 1) / stride

-- Whether report r's id is new: in none of its bucket's live sets, nor earlier in the batch.
local in_batch = {}
local function is_new(r)
  local base = first + stride * (r - 1)
  local set = 10 + 3 * tonumber(ARGV[base])
  local member = ARGV[base + 1]
  local name = ARGV[base] .. ':' .. member
  if in_batch[name] then
    return false
  end
  in_batch[name] = true
  for age = 0, 2 do
    if redis.call('SISMEMBER', KEYS[set + age], member) == 1 then
      return false
    end
  end
  return true
end

-- BITFIELD with one operation per count, ops of them per call (Lua's unpack has a limit).
local function bitfield(key, op, pairs_list)
  local batch = 500
  for start = 1, #pairs_list, batch do
    local args = {}
    for i = start, math.min(start + batch - 1, #pairs_list) do
      local pair = pairs_list[i]
      args[#args + 1] = op
      args[#args + 1] = 'u32'
      args[#args + 1] = '#' .. pair[1]
      args[#args + 1] = pair[2]
    end
    redis.call('BITFIELD', key, unpack(args))
  end
end

-- Add the tally to the period's counts: the dense string if there is one, else the hash,
-- which becomes the dense string (allocated whole, at the campaign's last output) once it
-- has ARGV[10] fields.
local function count_period(tally)
  local hash, dense = KEYS[6], KEYS[7]
  local target = dense
  if redis.call('EXISTS', dense) == 1 then
    local list = {}
    for output, count in pairs(tally) do
      list[#list + 1] = {output, count}
    end
    bitfield(dense, 'INCRBY', list)
  else
    for output, count in pairs(tally) do
      redis.call('HINCRBY', hash, output, count)
    end
    target = hash
    if redis.call('HLEN', hash) >= tonumber(ARGV[10]) then
      local fields = redis.call('HGETALL', hash)
      local list = {{ARGV[11], 0}}
      for i = 1, #fields, 2 do
        list[#list + 1] = {fields[i], fields[i + 1]}
      end
      bitfield(dense, 'SET', list)
      redis.call('DEL', hash)
      target = dense
    end
  end
  local ttl = tonumber(ARGV[9])
  if ttl > 0 then
    redis.call('EXPIRE', target, ttl)
  end
end

local fresh = {}
local n_fresh = 0
if size_only then
  n = tonumber(ARGV[first])
  n_fresh = n
end
for r = 1, size_only and 0 or n do
  if is_new(r) then
    fresh[r] = true
    n_fresh = n_fresh + 1
  end
end
if enrollment and not size_only then
  local tokens = {}
  for r = 1, n do
    if fresh[r] then
      local token = ARGV[first + stride * (r - 1) + 3]
      if token == '' or tokens[token] or redis.call('SISMEMBER', KEYS[5], token) == 0 then
        return {NO_TOKEN, 0, 0, r, hits, ttl}
      end
      tokens[token] = true
    end
  end
end
local budget = tonumber(ARGV[14])
if budget > 0 and n_fresh > 0 then
  if tonumber(redis.call('GET', KEYS[9]) or '0') + n_fresh > budget then
    local budget_ttl = redis.call('TTL', KEYS[9])
    if budget_ttl < 0 then
      budget_ttl = tonumber(ARGV[15])
    end
    return {OVER_BUDGET, 0, 0, 0, hits, budget_ttl}
  end
end
local quota = tonumber(ARGV[16])
if quota > 0 and n_fresh > 0 then
  if tonumber(redis.call('HGET', KEYS[1], 'n_reports') or '0') + n_fresh > quota then
    return {OVER_QUOTA, 0, 0, 0, hits, ttl}
  end
end
if check_only or n_fresh == 0 then
  return {STORED, n_fresh, n - n_fresh, 0, hits, ttl}
end
if budget > 0 and redis.call('INCRBY', KEYS[9], n_fresh) == n_fresh then
  redis.call('EXPIRE', KEYS[9], ARGV[15])
end

local tally = {}
local touched = {}
local now_ms = ARGV[4]
for r = 1, n do
  if fresh[r] then
    local base = first + stride * (r - 1)
    local set = 10 + 3 * tonumber(ARGV[base])
    local output = ARGV[base + 2]
    redis.call('SADD', KEYS[set], ARGV[base + 1])
    touched[set] = true
    tally[output] = (tally[output] or 0) + 1
    if enrollment then
      redis.call('SREM', KEYS[5], ARGV[base + 3])
    end
    if keep then
      redis.call('XADD', KEYS[4], '*', 'report_id', ARGV[base + stride - 1], 'y', output,
        'value', values[output])
    end
  end
end
for set in pairs(touched) do
  redis.call('EXPIRE', KEYS[set], ARGV[8])
end
for output, count in pairs(tally) do
  redis.call('HINCRBY', KEYS[2], output, count)
end
count_period(tally)
redis.call('HINCRBY', KEYS[1], 'n_reports', n_fresh)
redis.call('HSET', KEYS[1], 'last_ms', now_ms)
redis.call('HINCRBY', KEYS[3], ARGV[3], n_fresh)
local min_id = tonumber(ARGV[7])
if keep and min_id > 0 then
  redis.call('XTRIM', KEYS[4], 'MINID', min_id)
end
return {STORED, n_fresh, n - n_fresh, 0, hits, ttl}

-- Ingest a batch of validated reports into one campaign, atomically.
--
-- KEYS[1] campaign hash   KEYS[2] counts hash   KEYS[3] hourly counts hash
-- KEYS[4] report stream   KEYS[5] unused enrollment tokens (set of SHA-256 hex digests)
-- KEYS[6..] one "seen" key per report (report id dedupe)
-- ARGV[1] dedupe retention in seconds   ARGV[2] hour bucket (unix seconds)
-- ARGV[3] 1 if the campaign requires enrollment, else 0
-- ARGV[4] retention: stream entries older than this id (unix ms) are trimmed; 0 keeps all
-- ARGV[5 + 4i] .. ARGV[8 + 4i]: report i's id, output index, value JSON, token digest ('' if none)
--
-- Returns {status, accepted, duplicates, index}; status 0 = stored, 1 = no such campaign,
-- 2 = campaign closed, 3 = report number `index` (1-based) has no unused enrollment token.
-- Nothing is written unless the status is 0. A report id already stored is a duplicate
-- whatever its token (a retry must not be refused because its token was spent by itself).
local status = redis.call('HGET', KEYS[1], 'status')
if not status then
  return {1, 0, 0, 0}
end
if status ~= 'open' then
  return {2, 0, 0, 0}
end
local ttl = ARGV[1]
local hour = ARGV[2]
local enrollment = ARGV[3] == '1'
local min_id = tonumber(ARGV[4])
local n = #KEYS - 5

if enrollment then
  local ids, tokens = {}, {}
  for r = 1, n do
    local base = 1 + 4 * r
    local id, token = ARGV[base], ARGV[base + 3]
    if not ids[id] and redis.call('EXISTS', KEYS[5 + r]) == 0 then
      ids[id] = true
      if token == '' or tokens[token] or redis.call('SISMEMBER', KEYS[5], token) == 0 then
        return {3, 0, 0, r}
      end
      tokens[token] = true
    end
  end
end

local accepted = 0
local duplicates = 0
for r = 1, n do
  local base = 1 + 4 * r
  if redis.call('SET', KEYS[5 + r], '1', 'NX', 'EX', ttl) then
    local output = ARGV[base + 1]
    if enrollment then
      redis.call('SREM', KEYS[5], ARGV[base + 3])
    end
    redis.call('HINCRBY', KEYS[2], output, 1)
    redis.call('XADD', KEYS[4], '*', 'report_id', ARGV[base], 'y', output, 'value', ARGV[base + 2])
    accepted = accepted + 1
  else
    duplicates = duplicates + 1
  end
end
if accepted > 0 then
  redis.call('HINCRBY', KEYS[1], 'n_reports', accepted)
  redis.call('HINCRBY', KEYS[3], hour, accepted)
  if min_id > 0 then
    redis.call('XTRIM', KEYS[4], 'MINID', min_id)
  end
end
return {0, accepted, duplicates, 0}

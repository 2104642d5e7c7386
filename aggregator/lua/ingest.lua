-- Ingest a batch of validated reports into one campaign, atomically.
--
-- KEYS[1] campaign hash   KEYS[2] counts hash   KEYS[3] hourly counts hash
-- KEYS[4] report stream   KEYS[5..] one "seen" key per report (report id dedupe)
-- ARGV[1] dedupe retention in seconds   ARGV[2] hour bucket (unix seconds)
-- ARGV[3 + 3i], ARGV[4 + 3i], ARGV[5 + 3i]: report i's id, output index, value JSON
--
-- Returns {status, accepted, duplicates}; status 0 = stored, 1 = no such campaign,
-- 2 = campaign closed (nothing is written in cases 1 and 2).
local status = redis.call('HGET', KEYS[1], 'status')
if not status then
  return {1, 0, 0}
end
if status ~= 'open' then
  return {2, 0, 0}
end
local ttl = ARGV[1]
local hour = ARGV[2]
local accepted = 0
local duplicates = 0
for i = 5, #KEYS do
  local base = 3 + (i - 5) * 3
  if redis.call('SET', KEYS[i], '1', 'NX', 'EX', ttl) then
    local output = ARGV[base + 1]
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
end
return {0, accepted, duplicates}

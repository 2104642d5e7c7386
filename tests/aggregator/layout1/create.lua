-- Create a campaign record unless one exists under that id.
-- KEYS[1] campaign hash; ARGV[1] canonical spec JSON, ARGV[2] spec hash, ARGV[3] created_at.
-- Returns CREATED, or TAKEN when the id was already taken (aggregator.storage.store.CreateStatus).
local TAKEN, CREATED = 0, 1
if redis.call('EXISTS', KEYS[1]) == 1 then
  return TAKEN
end
redis.call('HSET', KEYS[1], 'spec', ARGV[1], 'spec_hash', ARGV[2], 'status', 'open',
  'created_at', ARGV[3], 'n_reports', 0)
return CREATED

-- Create a campaign record unless one exists under that id.
-- KEYS[1] campaign hash; ARGV[1] canonical spec JSON, ARGV[2] spec hash, ARGV[3] created_at,
-- ARGV[4] layout version, ARGV[5] shards, ARGV[6] buckets per shard and window,
-- ARGV[7] window length in seconds, ARGV[8] each shard's salt, comma-separated ('' when all
-- are 0) (aggregator.storage.layout).
-- Returns CREATED, or TAKEN when the id was already taken (aggregator.storage.store.CreateStatus).
local TAKEN, CREATED = 0, 1
if redis.call('EXISTS', KEYS[1]) == 1 then
  return TAKEN
end
redis.call('HSET', KEYS[1], 'spec', ARGV[1], 'spec_hash', ARGV[2], 'status', 'open',
  'created_at', ARGV[3], 'layout', ARGV[4], 'shards', ARGV[5], 'buckets', ARGV[6],
  'window_s', ARGV[7])
if ARGV[8] ~= '' then
  redis.call('HSET', KEYS[1], 'placement', ARGV[8])
end
return CREATED

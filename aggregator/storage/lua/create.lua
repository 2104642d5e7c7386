-- Create a campaign record unless one exists under that id.
-- KEYS[1] campaign hash; ARGV[1] canonical spec JSON, ARGV[2] spec hash, ARGV[3] created_at.
-- Returns 1 when created, 0 when the id was already taken.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], 'spec', ARGV[1], 'spec_hash', ARGV[2], 'status', 'open',
  'created_at', ARGV[3], 'n_reports', 0)
return 1

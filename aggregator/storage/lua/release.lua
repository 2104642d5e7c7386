-- Give back reports reserved by admit.lua and not stored (duplicates, refusals, failures).
--
-- KEYS[1] the client's new-reports counter   KEYS[2] the campaign's admitted reports
-- ARGV[1] reports to give back to the budget (0 if it was not charged)
-- ARGV[2] reports to give back to the campaign
--
-- A budget counter that has expired with its window is not brought back; neither
-- counter goes below zero.
for i = 1, 2 do
  local amount = tonumber(ARGV[i])
  if amount > 0 then
    local left = tonumber(redis.call('GET', KEYS[i]) or '0')
    if left > 0 then
      redis.call('DECRBY', KEYS[i], math.min(amount, left))
    end
  end
end
return 0

-- The change script of the earlier record writer, kept as it ran: the tests
-- settle records with it, and the new-key benchmark runs it as its baseline.
local f = redis.call('HMGET', KEYS[1], 'state', 'token')
if f[1] ~= 'in_flight' or f[2] ~= ARGV[1] then
  return {'fenced', f[2] or ''}
end
if ARGV[3] == 'lease' then
  redis.call('HSET', KEYS[1], 'lease', ARGV[4], 'updated', ARGV[2])
else
  redis.call('HSET', KEYS[1], 'state', ARGV[4], 'kind', ARGV[5], 'body', ARGV[6], 'meta', ARGV[7],
    'lease', '', 'updated', ARGV[2])
end
return {'held'}

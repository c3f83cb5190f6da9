-- The claim script of the earlier record writer, kept as it ran: the tests
-- write records with it and read them with the store, and the new-key
-- benchmark runs it as its baseline.
local f = redis.call('HMGET', KEYS[1], 'fp', 'state', 'token', 'lease', 'kind', 'body', 'meta', 'created', 'expires')
local function rule_of(fp)
  if string.len(fp) == 32 and string.sub(fp, 1, 4) == ARGV[9] then
    return string.sub(fp, 5, 8)
  end
  return ''
end
local other_rule = nil
local function answer(reply)
  if other_rule then
    table.insert(reply, 'other_rule')
    table.insert(reply, f[1])
  end
  return reply
end
local now = tonumber(ARGV[4])
local token = tonumber(ARGV[5])
local took_over = '0'
local created = now
local expires = now + tonumber(ARGV[7])
if f[2] then
  if not f[3] or not f[9] then
    return {'corrupt', 'no token or expiry'}
  end
  local stored = tonumber(f[3])
  local grace = tonumber(ARGV[10])
  if tonumber(f[9]) <= now and now < tonumber(f[9]) + grace then
    if f[1] ~= ARGV[3] and rule_of(f[1] or '') == rule_of(ARGV[3]) then
      return {'key_reuse'}
    end
    return {'expired', f[9]}
  elseif tonumber(f[9]) <= now then
    token = math.max(stored + 1, token)
  elseif f[1] ~= ARGV[3] and rule_of(f[1] or '') == rule_of(ARGV[3]) then
    return {'key_reuse'}
  elseif f[2] ~= 'in_flight' then
    other_rule = f[1] ~= ARGV[3]
    if not f[5] then
      return {'corrupt', 'a settled record without an outcome'}
    end
    return answer({'replay', f[5], f[6] or '', f[7] or '{}', f[9]})
  else
    other_rule = f[1] ~= ARGV[3]
    if f[4] and f[4] ~= '' then
      local lease_until = tonumber(f[4])
      if lease_until > now then
        return answer({'in_flight', string.format('%.0f', math.min(lease_until - now, tonumber(ARGV[8])))})
      end
      took_over = '1'
    end
    token = stored + 1
    created = tonumber(f[8])
    expires = tonumber(f[9])
  end
end
local lease_until = now + tonumber(ARGV[6])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'scope', ARGV[1], 'key', ARGV[2], 'fp', ARGV[3], 'state', 'in_flight',
  'token', string.format('%.0f', token), 'lease', string.format('%.0f', lease_until),
  'created', string.format('%.0f', created), 'updated', ARGV[4],
  'expires', string.format('%.0f', expires))
redis.call('PEXPIRE', KEYS[1], string.format('%.0f', math.max(expires + tonumber(ARGV[10]) - now, 1)))
return answer({'claimed', string.format('%.0f', token), string.format('%.0f', lease_until), took_over,
  string.format('%.0f', expires)})

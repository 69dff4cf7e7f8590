-- renew.lua: the current lease holder extends one or more leases by lease_ttl from now.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     host_id token_digest n, then task_id lease_id per lease
-- Returns  per lease a flat pair: {"ok", expires_at_ms} or {"cancel", expires_at_ms} (renewed,
--          and a cancel was requested: stop the runner and report `cancelled`), or
--          {"lost", REASON} with REASON one of not_found superseded expired finished not_owner:
--          the lease is gone and the worker must stop that runner and report nothing.
-- Errors   AUTH (unknown host / wrong token), INVALID (bad arguments).
local host_id, digest, n = ARGV[1], ARGV[2], tonumber(ARGV[3])
local hk, err = auth_host(host_id, digest)
if not hk then return err end
if not n or n < 0 or #ARGV ~= 3 + n * 2 then return fail('INVALID', 'bad argument count') end
for i = 0, n - 1 do
  if not valid_id(ARGV[4 + i * 2]) or not valid_id(ARGV[5 + i * 2]) then
    return fail('INVALID', 'malformed task or lease id')
  end
end
local now = now_ms()
local ttl = cfg_ms('lease_ttl')
local out = {}
for i = 0, n - 1 do
  local id, lease = ARGV[4 + i * 2], ARGV[5 + i * 2]
  local tk = k('task', id)
  local t = redis.call('HMGET', tk, 'status', 'lease_id', 'host_id', 'lease_expires_at', 'cancel_requested')
  local reason
  if not t[1] then reason = 'not_found'
  elseif TERMINAL[t[1]] then reason = t[2] == lease and 'finished' or 'superseded'
  elseif t[1] == 'queued' then reason = 'expired'  -- its lease expired (or was handed back)
  elseif t[2] ~= lease then reason = 'superseded'
  elseif t[3] ~= host_id then reason = 'not_owner'
  elseif tonumber(t[4]) <= now then reason = 'expired'  -- not revived: the expiry scan ends it
  end
  if reason then
    out[#out + 1] = 'lost'; out[#out + 1] = reason
  else
    local expires = now + ttl
    redis.call('HSET', tk, 'lease_expires_at', expires, 'renewed_at', now)
    redis.call('ZADD', k('leases'), expires, id)
    out[#out + 1] = t[5] == '1' and 'cancel' or 'ok'
    out[#out + 1] = expires
  end
end
return out

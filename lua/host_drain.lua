-- host_drain.lua: stop (drain) or resume (undrain) new assignments to a host. Work already
-- assigned or running is untouched.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     host_id draining(1|0) token_digest('' = operator action, no token needed)
-- Returns  "draining" | "active"
-- Errors   NOT_FOUND (no host), AUTH (a token digest was given and is wrong), INVALID
local host_id, flag, digest = ARGV[1], ARGV[2], ARGV[3]
if not valid_id(host_id) then return fail('INVALID', 'malformed host id') end
if flag ~= '1' and flag ~= '0' then return fail('INVALID', 'draining must be 1 or 0') end
local hk = k('host', host_id)
if redis.call('EXISTS', hk) == 0 then return fail('NOT_FOUND', 'no host ' .. host_id) end
if digest ~= '' then
  local ok, err = auth_host(host_id, digest)
  if not ok then return err end
end
if redis.call('HGET', hk, 'draining') ~= flag then
  redis.call('HSET', hk, 'draining', flag)
  emit(flag == '1' and 'host_draining' or 'host_undrained', 'host', host_id)
  if flag == '0' then wake(k('sched', 'wake')) end
end
return flag == '1' and 'draining' or 'active'

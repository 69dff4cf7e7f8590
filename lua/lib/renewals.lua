--- @include "lib/base"
--- @include "lib/config"
--- @include "lib/args"
--- @include "gen/statuses"
--- @include "gen/args/renew"
-- lib/renewals.lua: the current lease holder extends leases (renew.lua, and heartbeat.lua for
-- the leases a heartbeat carries): `leases_in`, `renew_leases`.

-- the leases of a call: packed (deviceq.core.script_args RENEW) n * LEASE_N values (n nil:
-- as many as there are, at most 10000), each id checked; nil when they are not that (the
-- caller fails INVALID); else the values and n
local function leases_in(packed, n)
  if not n and type(packed) == 'string' then
    local ok, A = pcall(cmsgpack.unpack, packed)
    if not ok or type(A) ~= 'table' or #A % LEASE_N ~= 0 or #A > 10000 * LEASE_N then return nil end
    n = #A / LEASE_N
  end
  local A = packed_items(packed, n, LEASE_N)
  if not A then return nil end
  for i = 0, n - 1 do
    if not valid_id(A[i * LEASE_N + LEASE_TASK_ID]) or not valid_id(A[i * LEASE_N + LEASE_LEASE_ID]) then
      return nil
    end
  end
  return A, n
end

-- renew the n leases of A (leases_in) held by host `host_id`, session `session`, each by
-- lease_ttl from now: per lease a flat triple (renew.lua's reply)
local function renew_leases(A, n, host_id, session)
  local now = now_ms()
  local ttl = cfg_ms('lease_ttl')
  local expires_s = I(now + ttl)
  local out = {}
  for i = 0, n - 1 do
    local id, lease = A[i * LEASE_N + LEASE_TASK_ID], A[i * LEASE_N + LEASE_LEASE_ID]
    local tk = k('task', id)
    local t = redis.call('HMGET', tk, 'status', 'lease_id', 'host_id', 'lease_expires_at',
      'cancel_requested', 'session', 'gang', 'preempt_by', 'preempt_grace_ms')
    local reason
    if not t[1] then reason = 'not_found'
    elseif TERMINAL[t[1]] then reason = t[2] == lease and 'finished' or 'superseded'
    elseif t[1] == 'queued' and (t[7] or '') ~= '' then reason = 'gang_ended'  -- another part ended
    elseif t[1] == 'queued' then reason = 'expired'  -- its lease expired (or was handed back)
    elseif t[2] ~= lease then reason = 'superseded'
    elseif t[3] ~= host_id then reason = 'not_owner'
    elseif t[1] == 'dispatched' and (t[6] or '') ~= session then reason = 'superseded'
    elseif (tonumber(t[4]) or 0) <= now then reason = 'expired'  -- not revived: the scan ends it
    end
    if reason then
      out[#out + 1] = 'lost'; out[#out + 1] = reason; out[#out + 1] = 0
    else
      redis.call('HSET', tk, 'lease_expires_at', expires_s, 'renewed_at', now_str())
      redis.call('ZADD', k('leases'), expires_s, id)
      if t[5] == '1' then out[#out + 1] = 'cancel'
      elseif (t[8] or '') ~= '' then out[#out + 1] = 'preempt:' .. (t[9] or '0')
      else out[#out + 1] = 'ok' end
      out[#out + 1] = expires_s
      out[#out + 1] = ttl
    end
  end
  return out
end

--- @include "lib/base"
--- @include "lib/config"
-- lib/liveness.lua: the liveness rule of a host (deviceq.core.liveness mirrors it).

local function host_alive(hk)
  local hb = tonumber(redis.call('HGET', hk, 'last_heartbeat') or '0') or 0
  return hb > 0 and now_ms() - hb <= cfg_ms('host_timeout')
end

-- can the host take new work? true, or the reason it cannot: host_dead (no heartbeat within
-- host_timeout), host_suspect (one of its leases expired since its last heartbeat),
-- host_draining (operator drain or daemon shutting down)
local function host_placeable(hk)
  local h = redis.call('HMGET', hk, 'last_heartbeat', 'draining', 'stopping', 'suspect')
  local hb = tonumber(h[1] or '0') or 0
  if hb <= 0 or now_ms() - hb > cfg_ms('host_timeout') then return 'host_dead' end
  if h[2] == '1' or h[3] == '1' then return 'host_draining' end
  if h[4] and h[4] ~= '' then return 'host_suspect' end
  return true
end

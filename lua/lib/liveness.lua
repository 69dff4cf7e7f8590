--- @include "lib/base"
--- @include "lib/config"
-- lib/liveness.lua: the liveness rule of a host (deviceq.core.liveness mirrors it).

-- a host whose last heartbeat (field last_heartbeat, ms) is `hb` is alive: one within
-- host_timeout
local function heartbeat_fresh(hb)
  hb = tonumber(hb or '0') or 0
  return hb > 0 and now_ms() - hb <= cfg_ms('host_timeout')
end

local function host_alive(hk)
  return heartbeat_fresh(redis.call('HGET', hk, 'last_heartbeat'))
end

-- can the host take new work? true, or the reason it cannot: host_dead (no heartbeat within
-- host_timeout), host_suspect (one of its leases expired since its last heartbeat),
-- host_draining (operator drain or daemon shutting down)
local function host_placeable(hk)
  local h = redis.call('HMGET', hk, 'last_heartbeat', 'draining', 'stopping', 'suspect')
  if not heartbeat_fresh(h[1]) then return 'host_dead' end
  if h[2] == '1' or h[3] == '1' then return 'host_draining' end
  if h[4] and h[4] ~= '' then return 'host_suspect' end
  return true
end

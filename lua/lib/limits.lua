--- @include "lib/base"
--- @include "lib/config"
--- @include "gen/limits"
-- lib/limits.lua: the pool's hard limits on leases held at once, checked and counted for every
-- limit declared in deviceq.core.limits (generated: LIMITS, each {name, reason, counter, scope,
-- setting}; no setting: each tenant's own max_devices from `tenants`, WEIGHT:MAX_DEVICES).
-- A lease is described by its scope values {host = HOST_ID, tenant = TENANT}; it counts under a
-- limit when every field of the limit's scope is set, in hash COUNTER at field "V1|V2".
-- Counts change at once (limits_count) or, between limits_defer() and limits_flush(), are kept
-- in memory and written once per counter field at the flush; limits_refusal sees both.

local _lim_now, _lim_later, _lim_bound = {}, nil, {}

local function limit_field(L, lease)
  local parts = {}
  for i, s in ipairs(L.scope) do
    local v = lease[s]
    if not v or v == '' then return nil end
    parts[i] = v
  end
  return table.concat(parts, '|')
end

local function limit_bound(L, lease)
  if L.setting then
    local b = _lim_bound[L.name]
    if b == nil then b = math.floor(cfg(L.setting)); _lim_bound[L.name] = b end
    return b
  end
  local tenant = lease.tenant
  local b = _lim_bound['tenant|' .. tenant]
  if b == nil then
    local spec = redis.call('HGET', k('tenants'), tenant) or ''
    b = tonumber(spec:match('^%d+:(%d+)$') or '0') or 0
    _lim_bound['tenant|' .. tenant] = b
  end
  return b
end

local function limits_defer()
  _lim_later = {}
end

-- the reason (a limit's `reason`) why `more` more leases like `lease` would break a limit, or
-- nil: the stored count (read once a call per field) plus this call's deferred counts
local function limits_refusal(lease, more)
  for _, L in ipairs(LIMITS) do
    local f = limit_field(L, lease)
    if f then
      local bound = limit_bound(L, lease)
      if bound > 0 then
        local key = L.counter .. '|' .. f
        local held = _lim_now[key]
        if held == nil then
          held = tonumber(redis.call('HGET', k(L.counter), f) or '0') or 0
          _lim_now[key] = held
        end
        local later = _lim_later and _lim_later[L.counter] and _lim_later[L.counter][f] or 0
        if held + later + (more or 1) > bound then return L.reason end
      end
    end
  end
  return nil
end

-- `by` (+1: a lease made, -1: one ended) leases like `lease` under every limit it counts under
local function limits_count(lease, by)
  for _, L in ipairs(LIMITS) do
    local f = limit_field(L, lease)
    if f then
      if _lim_later then
        local c = _lim_later[L.counter] or {}
        _lim_later[L.counter] = c
        c[f] = (c[f] or 0) + by
      elseif redis.call('HINCRBY', k(L.counter), f, I(by)) <= 0 then
        redis.call('HDEL', k(L.counter), f)
      end
    end
  end
end

local function limits_flush()
  for counter, fields in pairs(_lim_later or {}) do
    for f, by in pairs(fields) do
      if by ~= 0 and redis.call('HINCRBY', k(counter), f, I(by)) <= 0 then
        redis.call('HDEL', k(counter), f)
      end
    end
  end
  _lim_later = nil
end

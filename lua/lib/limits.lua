--- @include "lib/base"
--- @include "lib/config"
--- @include "gen/limits"
-- lib/limits.lua: the pool's hard limits on leases held at once, checked and counted for every
-- limit declared in deviceq.core.limits (generated: LIMITS, each {name, reason, counter, scope,
-- setting}; no setting: each tenant's own max_devices from `tenants`, WEIGHT:MAX_DEVICES).
-- A lease is described by its host and tenant; it counts under a limit when every field of the
-- limit's scope is set, in hash COUNTER at field "V1|V2".
-- Counts change at once (limits_count) or, between limits_defer() and limits_flush(), are kept
-- in memory and written once per counter field at the flush; limits_refusal sees both.

local _lim_now, _lim_later, _lim_bound = {}, nil, {}

-- the count field of a lease of `host` and `tenant` under limit L (its scope: one or two of
-- 'host', 'tenant'), or nil when a scope value is unset (the lease is not counted)
local function limit_field(L, host, tenant)
  local s = L.scope
  local a = s[1] == 'host' and host or tenant
  if not a or a == '' then return nil end
  if not s[2] then return a end
  local b = s[2] == 'host' and host or tenant
  if not b or b == '' then return nil end
  return a .. '|' .. b
end

-- the bound of L for a lease of `tenant` (0 = none): its setting (read once a call) or the
-- tenant's own cap (WEIGHT:MAX_DEVICES in `tenants`, read once a call per tenant)
local function limit_bound(L, tenant)
  if L.setting then
    local b = _lim_bound[L.name]
    if b == nil then b = math.floor(cfg(L.setting)); _lim_bound[L.name] = b end
    return b
  end
  if not tenant or tenant == '' then return 0 end
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

-- the reason (a limit's `reason`) why `more` more leases of `host` and `tenant` would break a
-- limit, or nil: the stored count (read once a call per field) plus this call's deferred counts
local _lim_checked  -- the limits that may refuse in this call (a setting's unset: never)
local function limits_refusal(host, tenant, more)
  if not _lim_checked then
    _lim_checked = {}
    for _, L in ipairs(LIMITS) do
      if not L.setting or limit_bound(L) > 0 then _lim_checked[#_lim_checked + 1] = L end
    end
  end
  for _, L in ipairs(_lim_checked) do
    local bound = limit_bound(L, tenant)
    if bound > 0 then
      local f = limit_field(L, host, tenant)
      if f then
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

-- `by` (+1: a lease made, -1: one ended) leases of `host` and `tenant` under every limit they
-- count under
local function limits_count(host, tenant, by)
  for _, L in ipairs(LIMITS) do
    local f = limit_field(L, host, tenant)
    if f then
      if _lim_later then
        local c = _lim_later[L.counter]
        if not c then c = {}; _lim_later[L.counter] = c end
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

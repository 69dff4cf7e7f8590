--- @include "lib/base"
-- lib/config.lua: the pool's settings (the config hash; defaults and bounds: setting()).

-- a pool setting: the stored value, or the default when missing or not a number, clamped to
-- its bounds (a raw HSET of garbage can never break a script half-way). Each setting is read
-- once a call, by name (HGET): a script reads the few it needs, however many are stored.
local _cfg = {}
local function cfg_raw(name)
  local v = _cfg[name]
  if v == nil then
    v = redis.call('HGET', k('config'), name)  -- (false: not set)
    _cfg[name] = v
  end
  return v or nil
end
local function cfg(name)
  local v = tonumber(cfg_raw(name))
  local default, lo, hi = setting(name)
  if v == nil or v ~= v then v = default end
  if v < lo then v = lo elseif v > hi then v = hi end
  return v
end

-- a duration setting (seconds in the config hash) in ms
local function cfg_ms(name)
  return math.floor(cfg(name) * 1000)
end

-- a text setting as stored ('' when unset; callers validate it and fall back to SDEFAULTS)
local function cfg_text(name)
  return cfg_raw(name) or ''
end

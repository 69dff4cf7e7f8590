--- @include "lib/base"
-- lib/config.lua: the pool's settings (the config hash; defaults and bounds: setting()).

-- a pool setting: the stored value, or the default when missing or not a number, clamped to
-- its bounds (a raw HSET of garbage can never break a script half-way)
local _cfg
local function load_cfg()
  if not _cfg then
    _cfg = {}
    local flat = redis.call('HGETALL', k('config'))
    for i = 1, #flat, 2 do _cfg[flat[i]] = flat[i + 1] end
  end
  return _cfg
end
local function cfg(name)
  local v = tonumber(load_cfg()[name])
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
  return load_cfg()[name] or ''
end

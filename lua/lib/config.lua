--- @include "lib/base"
-- lib/config.lua: the pool's settings (config hash, DEFAULTS, BOUNDS).

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
  if v == nil or v ~= v then v = DEFAULTS[name] end
  local b = BOUNDS[name]
  if b then
    if v < b[1] then v = b[1] elseif v > b[2] then v = b[2] end
  end
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

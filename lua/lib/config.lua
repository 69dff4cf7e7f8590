--- @include "lib/base"
-- lib/config.lua: the pool's settings (the config hash; defaults and bounds: setting()).

-- a pool setting as stored (nil when not set). The first read of a call fetches, in one HMGET,
-- every setting the script reads by a literal name (listed in `names` when the script is
-- assembled: deviceq.core.scripts.settings_read); any other name is read alone (HGET). Each
-- is read once a call: a script reads the few it can use, however many are stored.
local _cfg
local function cfg_raw(name)
  if not _cfg then
    _cfg = {}
    local names = {--[[settings read]]}
    if #names > 0 then
      local vals = redis.call('HMGET', k('config'), unpack(names))
      for i = 1, #names do _cfg[names[i]] = vals[i] end  -- (false: not set)
    end
  end
  local v = _cfg[name]
  if v == nil then
    v = redis.call('HGET', k('config'), name)
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

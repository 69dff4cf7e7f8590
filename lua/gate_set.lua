--- @include "lib/base"
--- @include "lib/args"
-- gate_set.lua: add or remove a gate (deviceq.core.gates). Devices are checked against it
-- afterwards (gate_eval.lua over every device; device_attrs.lua at each attribute change).
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     add NAME JSON (deviceq.core.gates.Gate.stored: when_c, until_c, driver_type,
--          cooldown: seconds a device is held after each run, 0 for none) MAX |
--          remove NAME
-- Keys     reads/writes gates
-- Returns  "added" | "removed"
-- Errors   INVALID (also past MAX gates), EXISTS (a gate of that name), NOT_FOUND (remove: no
--          such gate)
local op, name = ARGV[1], ARGV[2]
if not valid_id(name) then return fail('INVALID', 'malformed gate name') end
if op == 'remove' then
  if #ARGV ~= 2 then return fail('INVALID', 'remove takes a name') end
  if redis.call('HDEL', k('gates'), name) == 0 then return fail('NOT_FOUND', 'no gate ' .. name) end
  return 'removed'
end
if op ~= 'add' or #ARGV ~= 4 then return fail('INVALID', 'use add NAME JSON MAX or remove NAME') end
local max = int_in(ARGV[4], 1, 64)
if not max then return fail('INVALID', 'malformed gate limit') end
local text = ARGV[3]
if #text > 8192 then return fail('INVALID', 'a gate is at most 8192 bytes') end
local ok, g = pcall(cjson.decode, text)
local cd = ok and type(g) == 'table' and g.cooldown or 0
if type(cd) ~= 'number' or cd < 0 or cd > 86400 or cd ~= math.floor(cd) then
  return fail('INVALID', 'a cooldown is 1 to 86400 whole seconds')
end
if not ok or type(g) ~= 'table' or type(g.when_c) ~= 'string' or (g.when_c == '' and cd == 0) or
   #g.when_c > 4096 or (cd > 0 and g.until_c ~= '') or type(g.until_c) ~= 'string' or #g.until_c > 4096 or
   type(g.driver_type) ~= 'string' or (g.driver_type ~= '' and not valid_id(g.driver_type)) then
  return fail('INVALID', 'malformed gate')
end
if redis.call('HEXISTS', k('gates'), name) == 1 then return fail('EXISTS', 'gate ' .. name .. ' exists') end
if redis.call('HLEN', k('gates')) >= max then
  return fail('INVALID', 'at most ' .. max .. ' gates (remove one first)')
end
g.created_at = now_ms()
redis.call('HSET', k('gates'), name, cjson.encode(g))
return 'added'

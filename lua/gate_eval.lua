--- @include "lib/base"
--- @include "lib/args"
--- @include "lib/gates"
-- gate_eval.lua: check the pool's gates on some devices (after a gate was added or removed:
-- `deviceq gate` calls it over every device in batches; lib/gates.lua gate_check; a device's
-- fields gated, gated_reason, gated_at, cool_until say which gate holds it).
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     device ids (1 to 500; unknown ones are skipped) | `:due` LIMIT: the devices whose
--          cooldown has ended (the `cooling` zset up to now, at most LIMIT, 1 to 500: the
--          scheduler's tick)
-- Keys     reads gates, device:ID:attrs, config; writes device:ID, cooling, idle, idle:c:*,
--          events, sched:wake
-- Returns  {devices gated, devices released}
-- Errors   INVALID
local ids = ARGV
if ARGV[1] == ':due' then
  local limit = #ARGV == 2 and int_in(ARGV[2], 1, 500)
  if not limit then return fail('INVALID', 'use :due LIMIT (1 to 500)') end
  ids = redis.call('ZRANGEBYSCORE', k('cooling'), '-inf', now_str(), 'LIMIT', '0', I(limit))
  if #ids == 0 then return {0, 0} end
else
  if #ARGV < 1 or #ARGV > 500 then return fail('INVALID', '1 to 500 device ids a call') end
  for i = 1, #ARGV do
    if not valid_id(ARGV[i]) then return fail('INVALID', 'malformed device id') end
  end
end
local gates = gates_load()
local held, freed = 0, 0
for i = 1, #ids do
  if ids ~= ARGV then redis.call('ZREM', k('cooling'), ids[i]) end  -- (gate_check adds it back while it cools)
  local r = gate_check(ids[i], gates)
  if r == 'gated' then held = held + 1 elseif r == 'ungated' then freed = freed + 1 end
end
return {held, freed}

--- @include "lib/base"
--- @include "lib/args"
--- @include "lib/gates"
-- gate_eval.lua: check the pool's gates on some devices (after a gate was added or removed:
-- `deviceq gate` calls it over every device in batches; lib/gates.lua gate_check).
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     device ids (1 to 500; unknown ones are skipped)
-- Keys     reads gates, device:ID:attrs, config; writes device:ID (its fields gated,
--          gated_reason, gated_at), idle, idle:c:*, events, sched:wake
-- Returns  {devices gated, devices released}
-- Errors   INVALID
if #ARGV < 1 or #ARGV > 500 then return fail('INVALID', '1 to 500 device ids a call') end
for i = 1, #ARGV do
  if not valid_id(ARGV[i]) then return fail('INVALID', 'malformed device id') end
end
local gates = gates_load()
local held, freed = 0, 0
for i = 1, #ARGV do
  local r = gate_check(ARGV[i], gates)
  if r == 'gated' then held = held + 1 elseif r == 'ungated' then freed = freed + 1 end
end
return {held, freed}

--- @include "lib/base"
--- @include "lib/args"
--- @include "lib/text"
--- @include "lib/events"
--- @include "lib/auth"
--- @include "lib/where"
--- @include "lib/gates"
--- @include "lib/attrs"
-- device_attrs.lua: set and unset attributes of devices, by an operator (mode op: one device,
-- event device_attributes) or by the owning host (mode host: its changes since it last sent
-- them, several devices a call; only its own devices, its current session only). Each value
-- is stored as KIND:TEXT (deviceq.core.attributes: n number, v version, b boolean 1|0, s
-- string), with the time it was reported in device:ID:attrs_at; an operator's value wins over
-- the host's until the operator unsets it (lib/attrs.lua). A host's daemon sends its devices'
-- attributes with its heartbeats (heartbeat.lua, device field attrs); mode host is the same
-- write apart from a heartbeat. A device whose attributes changed is checked against the
-- pool's gates (lib/gates.lua: held or released, events device_gated / device_ungated).
-- Everything is checked before the first write.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     op BY (an id, '' = operator) | host HOST_ID TOKEN SESSION;
--          then per device: DEVICE_ID NSET NUNSET, NSET pairs KEY ENCODED, NUNSET KEYs
--          (at most 400 devices a call, 32 sets and 32 unsets a device; a device ends with at
--          most 32 attributes)
-- Keys     reads/writes device:ID:attrs, device:ID:attrs_at, device:ID:attrs_host, attr_names, events, device:ID,
--          idle, idle:c:*, sched:wake; reads device:ID, host:ID (mode host), gates, config
-- Returns  the number of devices whose attributes changed
-- Errors   INVALID, NOT_FOUND (no device), AUTH, SUPERSEDED, DEVICE_OWNED (another host's device)
local mode = ARGV[1]
local first, by, host
if mode == 'op' then
  if #ARGV < 2 or not actor_fields(ARGV[2]) then return fail('INVALID', 'malformed actor (by)') end
  by = ARGV[2] ~= '' and ARGV[2] or 'operator'
  first = 3
elseif mode == 'host' then
  local _, err = auth_host(ARGV[2], ARGV[3], ARGV[4] or '')
  if err then return err end
  host = ARGV[2]
  first = 5
else
  return fail('INVALID', 'mode must be op or host')
end

-- check every device's entry first (nothing is written before all are known good)
local plans, i = {}, first
while i <= #ARGV do
  local did = ARGV[i]
  local nset, nunset = int_in(ARGV[i + 1], 0, 32), int_in(ARGV[i + 2], 0, 32)
  if not valid_id(did) then return fail('INVALID', 'malformed device id') end
  if not nset or not nunset then return fail('INVALID', 'set and unset counts must be 0 to 32') end
  local set, unset, seen = {}, {}, {}
  local p = i + 3
  for _ = 1, nset do
    local key, value = ARGV[p], ARGV[p + 1]
    if not valid_attr_key(key) then return fail('INVALID', 'malformed attribute name') end
    if not (valid_attr_value(value) and valid_utf8(value)) then return fail('INVALID', 'malformed value of attribute ' .. key) end
    if seen[key] then return fail('INVALID', 'attribute ' .. key .. ' is listed twice') end
    seen[key] = true
    set[#set + 1] = key
    set[#set + 1] = value
    p = p + 2
  end
  for _ = 1, nunset do
    if not valid_attr_key(ARGV[p]) then return fail('INVALID', 'malformed attribute name') end
    if seen[ARGV[p]] then return fail('INVALID', 'attribute ' .. ARGV[p] .. ' is listed twice') end
    seen[ARGV[p]] = true
    unset[#unset + 1] = ARGV[p]
    p = p + 1
  end
  if p - 1 > #ARGV then return fail('INVALID', 'an entry is shorter than its counts') end
  local d = redis.call('HMGET', k('device', did), 'host_id', 'attrs_op')
  if not d[1] then return fail('NOT_FOUND', 'no device ' .. did) end
  if host and d[1] ~= host then return fail('DEVICE_OWNED', 'device ' .. did .. ' is not of host ' .. host) end
  local plan, why = attrs_plan(did, mode, set, unset, false, d[2])
  if not plan then return fail('INVALID', why) end
  plans[#plans + 1] = plan
  if #plans > 400 then return fail('INVALID', 'at most 400 devices a call') end
  i = p
end
if mode == 'op' and #plans ~= 1 then return fail('INVALID', 'an operator changes one device a call') end

local now, changed, gates, names = now_str(), 0, nil, {}
for _, plan in ipairs(plans) do
  if attrs_apply(plan, now, names) > 0 then
    changed = changed + 1
    gates = gates or gates_load()
    gate_check(plan.did, gates)
  end
  if by and (#plan.set > 0 or #plan.unset > 0) then
    local set = {}
    for j = 1, #plan.set, 2 do set[#set + 1] = plan.set[j] end
    emit('device_attributes', 'device', plan.did, 'by', by, 'set', table.concat(set, ','),
      'unset', table.concat(plan.unset, ','))
  end
end
attrs_names_flush(names)
return changed

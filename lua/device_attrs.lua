--- @include "lib/base"
--- @include "lib/args"
--- @include "lib/text"
--- @include "lib/events"
--- @include "lib/auth"
--- @include "lib/where"
--- @include "lib/gates"
-- device_attrs.lua: set and unset attributes of devices, by an operator (mode op: one device,
-- event device_attributes) or by the owning host (mode host: its changes since it last sent
-- them, several devices a call; only its own devices, its current session only). Each value
-- is stored as KIND:TEXT (deviceq.core.attributes: n number, v version, b boolean 1|0, s
-- string), with the time it was reported in device:ID:attrs_at. A device whose attributes
-- changed is checked against the pool's gates (lib/gates.lua: held or released, events
-- device_gated / device_ungated). Everything is checked before the first write.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     op BY (an id, '' = operator) | host HOST_ID TOKEN SESSION;
--          then per device: DEVICE_ID NSET NUNSET, NSET pairs KEY ENCODED, NUNSET KEYs
--          (at most 400 devices a call, 32 sets and 32 unsets a device; a device ends with at
--          most 32 attributes)
-- Keys     reads/writes device:ID:attrs, device:ID:attrs_at, attr_names, events, device:ID,
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
local entries, i = {}, first
while i <= #ARGV do
  local did = ARGV[i]
  local nset, nunset = int_in(ARGV[i + 1], 0, 32), int_in(ARGV[i + 2], 0, 32)
  if not valid_id(did) then return fail('INVALID', 'malformed device id') end
  if not nset or not nunset then return fail('INVALID', 'set and unset counts must be 0 to 32') end
  local e = {did = did, set = {}, unset = {}}
  local p = i + 3
  for _ = 1, nset do
    local key, value = ARGV[p], ARGV[p + 1]
    if not valid_attr_key(key) then return fail('INVALID', 'malformed attribute name') end
    if not (valid_attr_value(value) and valid_utf8(value)) then return fail('INVALID', 'malformed value of attribute ' .. key) end
    e.set[#e.set + 1] = key
    e.set[#e.set + 1] = value
    p = p + 2
  end
  for _ = 1, nunset do
    if not valid_attr_key(ARGV[p]) then return fail('INVALID', 'malformed attribute name') end
    e.unset[#e.unset + 1] = ARGV[p]
    p = p + 1
  end
  if p - 1 > #ARGV then return fail('INVALID', 'an entry is shorter than its counts') end
  local owner = redis.call('HGET', k('device', did), 'host_id')
  if not owner then return fail('NOT_FOUND', 'no device ' .. did) end
  if host and owner ~= host then return fail('DEVICE_OWNED', 'device ' .. did .. ' is not of host ' .. host) end
  -- the count once written: present keys stay, new ones add, unset ones leave
  local ak = k('device', did, 'attrs')
  local after, gone = redis.call('HLEN', ak), {}
  for j = 1, #e.unset do
    if not gone[e.unset[j]] and redis.call('HEXISTS', ak, e.unset[j]) == 1 then
      gone[e.unset[j]] = true
      after = after - 1
    end
  end
  for j = 1, #e.set, 2 do
    if gone[e.set[j]] or redis.call('HEXISTS', ak, e.set[j]) == 0 then
      gone[e.set[j]] = nil
      after = after + 1
    end
  end
  if after > 32 then return fail('INVALID', 'device ' .. did .. ' would have more than 32 attributes') end
  entries[#entries + 1] = e
  if #entries > 400 then return fail('INVALID', 'at most 400 devices a call') end
  i = p
end
if mode == 'op' and #entries ~= 1 then return fail('INVALID', 'an operator changes one device a call') end

local now, changed, gates = now_str(), 0, nil
-- attr_names counts the devices having each name (a --where naming none warns as a typo)
local function count_name(key, by)
  if redis.call('HINCRBY', k('attr_names'), key, by) <= 0 then redis.call('HDEL', k('attr_names'), key) end
end
for _, e in ipairs(entries) do
  local ak, tk = k('device', e.did, 'attrs'), k('device', e.did, 'attrs_at')
  local n = 0
  for _, key in ipairs(e.unset) do
    if redis.call('HDEL', ak, key) == 1 then
      redis.call('HDEL', tk, key)
      count_name(key, -1)
      n = n + 1
    end
  end
  for j = 1, #e.set, 2 do
    local key, value = e.set[j], e.set[j + 1]
    local old = redis.call('HGET', ak, key)
    if old ~= value then
      redis.call('HSET', ak, key, value)
      if not old then count_name(key, 1) end
      n = n + 1
    end
    redis.call('HSET', tk, key, now)
  end
  if n > 0 then
    changed = changed + 1
    gates = gates or gates_load()
    gate_check(e.did, gates)
    if by then
      local names = {}
      for j = 1, #e.set, 2 do names[#names + 1] = e.set[j] end
      emit('device_attributes', 'device', e.did, 'by', by, 'set', table.concat(names, ','),
        'unset', table.concat(e.unset, ','))
    end
  end
end
return changed

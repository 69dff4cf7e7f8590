--- @include "lib/base"
--- @include "lib/args"
--- @include "lib/text"
--- @include "lib/events"
--- @include "lib/auth"
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
-- Keys     reads/writes device:ID:attrs, device:ID:attrs_at, events, device:ID (gated...),
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

local function valid_key(s)
  return type(s) == 'string' and #s <= 32 and s:match('^[a-z][a-z0-9_]*$') ~= nil
end

-- a value as deviceq.core.attributes.encode writes it
local function valid_value(s)
  if type(s) ~= 'string' or #s < 2 or s:sub(2, 2) ~= ':' then return false end
  local kind, text = s:sub(1, 1), s:sub(3)
  if kind == 'b' then return text == '1' or text == '0' end
  if kind == 'n' then
    if #text > 32 or not text:match('^%-?[%d%.eE%+%-]+$') then return false end
    local n = tonumber(text)
    return n ~= nil and n == n and n >= -1e15 and n <= 1e15
  end
  if kind == 'v' then
    return #text <= 80 and text:match('^%d[%d%.]*%d$') ~= nil and text:find('.', 1, true) ~= nil
      and not text:find('..', 1, true)
  end
  if kind == 's' then return #text <= 64 and valid_utf8(text) and not text:find('[%c"]') end
  return false
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
    if not valid_key(key) then return fail('INVALID', 'malformed attribute name') end
    if not valid_value(value) then return fail('INVALID', 'malformed value of attribute ' .. key) end
    e.set[#e.set + 1] = key
    e.set[#e.set + 1] = value
    p = p + 2
  end
  for _ = 1, nunset do
    if not valid_key(ARGV[p]) then return fail('INVALID', 'malformed attribute name') end
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
for _, e in ipairs(entries) do
  local ak, tk = k('device', e.did, 'attrs'), k('device', e.did, 'attrs_at')
  local n = 0
  if #e.unset > 0 then
    n = n + redis.call('HDEL', ak, unpack(e.unset))
    redis.call('HDEL', tk, unpack(e.unset))
  end
  if #e.set > 0 then
    local at = {}
    for j = 1, #e.set, 2 do
      at[#at + 1] = e.set[j]
      at[#at + 1] = now
      if redis.call('HGET', ak, e.set[j]) ~= e.set[j + 1] then n = n + 1 end
    end
    redis.call('HSET', ak, unpack(e.set))
    redis.call('HSET', tk, unpack(at))
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

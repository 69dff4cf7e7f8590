--- @include "lib/base"
--- @include "lib/events"
--- @include "lib/notify"
--- @include "lib/idle"
--- @include "lib/eligibility"
--- @include "lib/where"
-- lib/gates.lua: gates (deviceq.core.gates): named rules holding devices out of new work while
-- their attributes say so (device fields gated, gated_reason, gated_at), or for a while after
-- each run (a cooldown gate: device field cool_until, the `cooling` zset scored by it).

-- the pool's gates (the `gates` hash: JSON {name, driver_type, when_c, until_c, cooldown}), by
-- name; `cooldown` says whether one of them is a cooldown gate
local function gates_load()
  local list, cooldown = {}, false
  local raw = redis.call('HGETALL', k('gates'))
  for i = 2, #raw, 2 do
    local ok, g = pcall(cjson.decode, raw[i])
    if ok and type(g) == 'table' and type(g.when_c) == 'string' then
      g.name = raw[i - 1]
      if type(g.driver_type) ~= 'string' then g.driver_type = '' end
      if type(g.until_c) ~= 'string' then g.until_c = '' end
      g.cooldown = tonumber(g.cooldown) or 0
      if g.cooldown > 0 then g.until_c = ''; cooldown = true end
      if g.when_c ~= '' or g.cooldown > 0 then list[#list + 1] = g end
    end
  end
  table.sort(list, function(a, b) return a.name < b.name end)
  local by = {}
  for _, g in ipairs(list) do by[g.name] = g end
  return {list = list, by_name = by, cooldown = cooldown}
end

-- gates_load() read once per script call (for a call that releases many devices: a report of
-- a batch; no script that changes the gates uses it)
local gates_memo
local function gates_cached()
  if not gates_memo then gates_memo = gates_load() end
  return gates_memo
end

-- until when cooldown gate `g` holds a device whose last run ended at `released` (ms text),
-- or nil when it does not hold it now
local function cool_until(g, released)
  local at = tonumber(released or '')
  if g.cooldown <= 0 or not at then return nil end
  local till = at + g.cooldown * 1000
  if till <= now_ms() then return nil end
  return till
end

-- whether gate `g` holds device `did` (last run ended at `released`) by its when clauses
-- (a cooldown gate: within its time after that run, and its when clauses, if any, hold)
local function gate_holds(g, did, released)
  if g.cooldown > 0 and not cool_until(g, released) then return false end
  return g.when_c == '' or where_fails(did, g.when_c) == nil
end

-- what a gate shows of device `did`: its values of the attributes `compiled` names
-- ("battery 15"; booleans as true/false)
local function gate_reason(did, compiled)
  local keys, parts = {}, {}
  for _, line in ipairs(where_split(compiled, '\n')) do keys[#keys + 1] = where_split(line, '\t')[1] end
  local vals = redis.call('HMGET', k('device', did, 'attrs'), unpack(keys))
  for i, key in ipairs(keys) do
    local v = vals[i]
    if v then
      local text = v:sub(3)
      if v:sub(1, 1) == 'b' then text = text == '1' and 'true' or 'false' end
      parts[#parts + 1] = key .. ' ' .. text
    end
  end
  return table.concat(parts, ', ')
end

local function gate_applies(g, driver)
  return g.driver_type == '' or g.driver_type == driver
end

-- the gate that holds device `did` (host `host`, driver type `driver`, held by gate `cur` or
-- '') by `gates` (gates_load()): the gate holding it keeps it until its until clauses hold
-- (without any: until its when clauses no longer hold; a cooldown gate: until its time after
-- the device's last run, `released_at`, is up) or it is removed; else the first gate (by name)
-- whose when clauses hold takes it. Writes the device's gated fields, its cooldown's end
-- (cool_until, the `cooling` zset: gate_eval.lua's `due` call releases it then) and the
-- events; its place among the idle candidates is the caller's. Returns the gate's name, or ''.
local function gate_decide(did, gates, host, driver, cur)
  local dk = k('device', did)
  local released, cool_was = nil, ''
  if gates.cooldown or cur ~= '' then
    local c = redis.call('HMGET', dk, 'released_at', 'cool_until')
    released, cool_was = c[1], c[2] or ''
  end
  local target = nil
  local g = cur ~= '' and gates.by_name[cur] or nil
  if g and gate_applies(g, driver) then
    local release
    if g.until_c ~= '' then release = where_fails(did, g.until_c) == nil
    else release = not gate_holds(g, did, released) end
    if not release then target = g end
  end
  if not target then
    for _, c in ipairs(gates.list) do
      if c.name ~= cur and gate_applies(c, driver) and gate_holds(c, did, released) then
        target = c
        break
      end
    end
  end
  local till = target and cool_until(target, released)
  local reason = target and (till and ('cooling ' .. math.ceil((till - now_ms()) / 1000) .. ' s')
    or gate_reason(did, target.when_c))
  if till then redis.call('ZADD', k('cooling'), I(till), did)
  elseif cool_was ~= '' then redis.call('ZREM', k('cooling'), did) end
  if target and target.name == cur then
    redis.call('HSET', dk, 'gated_reason', reason, 'cool_until', till and I(till) or '')
    return cur
  end
  if cur ~= '' then emit('device_ungated', 'device', did, 'host', host, 'gate', cur) end
  if target then
    redis.call('HSET', dk, 'gated', target.name, 'gated_reason', reason, 'gated_at', now_str(),
      'cool_until', till and I(till) or '')
    emit('device_gated', 'device', did, 'host', host, 'gate', target.name, 'reason', reason)
    return target.name
  end
  if cur ~= '' then
    redis.call('HSET', dk, 'gated', '', 'gated_reason', '', 'gated_at', '', 'cool_until', '')
  end
  return ''
end

-- hold or release device `did` by `gates` (gate_decide), and put it among the idle candidates or
-- take it out accordingly. Returns 'gated', 'ungated' or nil (no change; the holding gate's
-- reason is refreshed).
local function gate_check(did, gates)
  local d = redis.call('HMGET', k('device', did), 'host_id', 'driver_type', 'gated')
  if not d[1] then
    redis.call('ZREM', k('cooling'), did)
    return nil
  end
  local cur = d[3] or ''
  local now_gated = gate_decide(did, gates, d[1], d[2], cur)
  if now_gated == cur then return nil end
  if now_gated ~= '' then
    idle_remove(did)
    return 'gated'
  end
  local _, added = refresh_idle(did, gate(did))
  if added then wake(k('sched', 'wake')) end
  return 'ungated'
end

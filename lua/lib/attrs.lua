--- @include "lib/base"
--- @include "lib/text"
--- @include "lib/where"
-- lib/attrs.lua: writing a device's attributes (deviceq.core.attributes), from its host (a
-- heartbeat's device field attrs, device_attrs.lua mode host) or from an operator
-- (device_attrs.lua mode op), by one rule:
--   device:ID:attrs      the values every reader uses (--where, gates, prefer), KIND:TEXT
--   device:ID:attrs_at   when each value was last sent (ms)
--   device field attrs_op  the names an operator set (csv): an operator's value wins over the
--                        host's until the operator unsets it; what the host reports for such a
--                        name meanwhile is kept in device:ID:attrs_host and comes back then.
-- A device has at most 32 attributes (MAX_DEVICE_ATTRS); a call checks that before writing.

local MAX_DEVICE_ATTRS = 32
local MAX_ATTRS_TEXT = 8192  -- a heartbeat's attrs field (32 sets and 32 unsets fit)

-- a heartbeat device's attrs field: entries one a line, `KEY=KIND:TEXT` (set) or `-KEY`
-- (unset). Returns set {KEY, VALUE, ...}, unset {KEY, ...}, or nil and why.
local function attrs_parse(text)
  if type(text) ~= 'string' or #text > MAX_ATTRS_TEXT then return nil, 'malformed attrs' end
  local set, unset, seen = {}, {}, {}
  if text == '' then return set, unset end
  for line in string.gmatch(text .. '\n', '([^\n]*)\n') do
    local key, value
    if line:sub(1, 1) == '-' then
      key = line:sub(2)
    else
      local e = line:find('=', 1, true)
      if not e then return nil, 'an attrs entry is KEY=VALUE or -KEY' end
      key, value = line:sub(1, e - 1), line:sub(e + 1)
    end
    if not valid_attr_key(key) then return nil, 'malformed attribute name' end
    if seen[key] then return nil, 'attribute ' .. key .. ' is listed twice' end
    seen[key] = true
    if value then
      if not (valid_attr_value(value) and valid_utf8(value)) then
        return nil, 'malformed value of attribute ' .. key
      end
      set[#set + 1] = key
      set[#set + 1] = value
    else
      unset[#unset + 1] = key
    end
  end
  if #set > 2 * MAX_DEVICE_ATTRS or #unset > MAX_DEVICE_ATTRS then
    return nil, 'at most 32 attributes set and 32 unset a device'
  end
  return set, unset
end

-- the names of csv `text` as a set
local function attrs_names(text)
  local out = {}
  if text and text ~= '' then
    for name in string.gmatch(text, '[^,]+') do out[name] = true end
  end
  return out
end

-- a change of device `did`'s attributes, checked (before any write): `source` host | op,
-- `set`/`unset` (attrs_parse), `full` (host only: `set` is every attribute the host reports,
-- the others it reported before leave), `op_csv` the device's attrs_op field, `new` (the
-- device is not registered yet: it has no attributes, nothing is read). Returns the plan
-- attrs_apply takes, or nil and why (the device would have more than 32 attributes).
local function attrs_plan(did, source, set, unset, full, op_csv, new)
  local ak = k('device', did, 'attrs')
  local op = attrs_names(op_csv)
  local p = {did = did, source = source, set = set, unset = unset, full = full, op = op,
    op_csv = op_csv or ''}
  local old, after = {}, 0
  if new then
    p.old = old
    return p
  end
  if full then
    local raw = redis.call('HGETALL', ak)
    for i = 1, #raw, 2 do old[raw[i]] = raw[i + 1] end
    for name in pairs(op) do if old[name] then after = after + 1 end end
    for j = 1, #set, 2 do if not op[set[j]] then after = after + 1 end end
  else
    local names = {}
    for j = 1, #set, 2 do names[#names + 1] = set[j] end
    for _, name in ipairs(unset) do names[#names + 1] = name end
    if #names == 0 then p.old = old return p end
    local vals = redis.call('HMGET', ak, unpack(names))
    for i, name in ipairs(names) do old[name] = vals[i] or nil end
    after = redis.call('HLEN', ak)
    local seen = {}
    for j = 1, #set, 2 do
      local name = set[j]
      seen[name] = true
      if not old[name] and (source == 'op' or not op[name]) then after = after + 1 end
    end
    for _, name in ipairs(unset) do
      if old[name] and not seen[name] then
        if source ~= 'op' then
          if not op[name] then after = after - 1 end
        -- (an operator's unset of its own value brings back the host's, if it reported one)
        elseif not op[name] or redis.call('HEXISTS', k('device', did, 'attrs_host'), name) == 0 then
          after = after - 1
        end
      end
    end
  end
  if after > MAX_DEVICE_ATTRS then
    return nil, 'device ' .. did .. ' would have more than 32 attributes'
  end
  p.old = old
  return p
end

-- write plan `p` (attrs_plan) at time `now`; `names` collects the change of the count of
-- devices having each name (attrs_names_flush writes it). Returns how many values changed.
local function attrs_apply(p, now, names)
  local ak, tk, hk = k('device', p.did, 'attrs'), k('device', p.did, 'attrs_at'),
    k('device', p.did, 'attrs_host')
  local old, op, n = p.old, p.op, 0
  local put, at, del = {}, {}, {}
  local function gone(name)
    del[#del + 1] = name
    names[name] = (names[name] or 0) - 1
    n = n + 1
  end
  if p.source == 'op' then
    local op_changed = false
    for _, name in ipairs(p.unset) do
      if op[name] then
        op[name], op_changed = nil, true
        local host = redis.call('HGET', hk, name)
        if host then
          redis.call('HDEL', hk, name)
          if host ~= old[name] then put[#put + 1] = name put[#put + 1] = host n = n + 1 end
        elseif old[name] then gone(name) end
      elseif old[name] then gone(name) end
    end
    for j = 1, #p.set, 2 do
      local name, value = p.set[j], p.set[j + 1]
      if not op[name] then
        op[name], op_changed = true, true
        if old[name] then redis.call('HSET', hk, name, old[name]) end  -- the host's, kept
      end
      if old[name] ~= value then
        put[#put + 1] = name
        put[#put + 1] = value
        if not old[name] then names[name] = (names[name] or 0) + 1 end
        n = n + 1
      end
      at[#at + 1] = name
      at[#at + 1] = now
    end
    if op_changed then
      local list = {}
      for name in pairs(op) do list[#list + 1] = name end
      table.sort(list)
      redis.call('HSET', k('device', p.did), 'attrs_op', table.concat(list, ','))
    end
  else
    local listed, shadow = {}, {}
    for j = 1, #p.set, 2 do
      local name, value = p.set[j], p.set[j + 1]
      listed[name] = true
      if op[name] then
        shadow[#shadow + 1] = name
        shadow[#shadow + 1] = value
      else
        if old[name] ~= value then
          put[#put + 1] = name
          put[#put + 1] = value
          if not old[name] then names[name] = (names[name] or 0) + 1 end
          n = n + 1
        end
        at[#at + 1] = name
        at[#at + 1] = now
      end
    end
    if p.full then
      for name in pairs(old) do
        if not op[name] and not listed[name] then gone(name) end
      end
      if p.op_csv ~= '' then
        local drop = {}
        for name in pairs(op) do if not listed[name] then drop[#drop + 1] = name end end
        if #drop > 0 then redis.call('HDEL', hk, unpack(drop)) end
      end
    else
      local drop = {}
      for _, name in ipairs(p.unset) do
        if op[name] then drop[#drop + 1] = name
        elseif old[name] and not listed[name] then gone(name) end
      end
      if #drop > 0 then redis.call('HDEL', hk, unpack(drop)) end
    end
    if #shadow > 0 then redis.call('HSET', hk, unpack(shadow)) end
  end
  if #del > 0 then
    redis.call('HDEL', ak, unpack(del))
    redis.call('HDEL', tk, unpack(del))
  end
  if #put > 0 then redis.call('HSET', ak, unpack(put)) end
  if #at > 0 then redis.call('HSET', tk, unpack(at)) end
  return n
end

-- the counts of devices having each attribute name (attr_names: a --where naming none is
-- warned about as a typo), changed by `names` (name -> change) in one write a name
local function attrs_names_flush(names)
  local key = k('attr_names')
  for name, by in pairs(names) do
    if by ~= 0 and redis.call('HINCRBY', key, name, I(by)) <= 0 then redis.call('HDEL', key, name) end
  end
end

-- lib/constraints.lua: the constraint rule and the bucket signature (deviceq.core.models
-- mirrors both).

local function set_of(csv)
  local s = {}
  if csv and csv ~= '' then
    for t in string.gmatch(csv, '[^,]+') do s[t] = true end
  end
  return s
end

-- THE constraint rule (deviceq.models.Constraints.matches mirrors it): a device satisfies a
-- task when the task names no driver type or the same one, and the device has every tag the
-- task requires. Returns true, or false and the reason.
local function satisfies(t_driver, t_tags, d_driver, d_tags)
  if t_driver and t_driver ~= '' and t_driver ~= d_driver then
    return false, 'driver_type_mismatch'
  end
  local have = set_of(d_tags)
  for t in string.gmatch(t_tags or '', '[^,]+') do
    if not have[t] then return false, 'missing_tag:' .. t end
  end
  return true
end

-- the bucket id of a constraint signature, tenant, where and pin
-- (deviceq.models.Constraints.signature mirrors it): a tenant's tasks have buckets of their
-- own, so fair share sees every tenant; `where` (compiled --where clauses, lib/where.lua) too;
-- a task pinned to one device has a bucket of its own pin (it waits for that device only, and
-- never holds up the tasks behind it)
local function signature(driver, tags, prio, tenant, pin, where)
  local raw = driver .. '|' .. tags .. '|' .. prio
  if tenant and tenant ~= '' then raw = raw .. '|' .. tenant end
  if where and where ~= '' then raw = raw .. '|w:' .. where end
  if pin and pin ~= '' then raw = raw .. '|@' .. pin end
  return string.sub(redis.sha1hex(raw), 1, 16)
end

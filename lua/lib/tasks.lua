--- @include "lib/base"
-- lib/tasks.lua: reading a task hash.

-- a task's whole hash in one read: its fields as a table (missing ones nil) and the flat
-- array (HGETALL)
local function load_task_flat(id)
  local flat = redis.call('HGETALL', k('task', id))
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t, flat
end

-- a task's fields as a table (missing ones nil). One HGETALL walks the small (listpack) hash
-- once: an HMGET of the ~30 fields the lifecycle helpers read looked each one up in turn and
-- cost about twice as much (bench/lifecycle/transitions.py, "Lua building blocks")
local function load_task(id)
  return (load_task_flat(id))
end

-- newer values of fields of a flat field/value array: appended (in place), so the array may
-- name a field twice; its reader takes the last value (deviceq.host.claims). Cheaper than
-- finding each field: that built a table of every field's place for each task.
local function flat_update(flat, ...)
  local n = #flat
  for i = 1, select('#', ...) do flat[n + i] = select(i, ...) end
end

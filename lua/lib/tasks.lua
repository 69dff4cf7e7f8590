--- @include "lib/base"
-- lib/tasks.lua: reading a task hash.

-- the task fields the lifecycle helpers need (lib/outcomes.lua, lib/handback.lua, the scripts)
local TASK_FIELDS = {'status', 'lease_id', 'lease_expires_at', 'host_id', 'device_id', 'attempt',
  'max_attempts', 'handbacks', 'seq', 'sig', 'driver_type', 'tags', 'priority', 'queue_deadline',
  'cancel_requested', 'dispatched_at', 'session', 'avoid_devices', 'avoid_hosts', 'failure_kind',
  'result', 'error', 'assigned_at', 'submitted_at', 'retry_on', 'retry_backoff', 'eligible_at',
  'tenant', 'gang', 'roles'}

local function load_task(id)
  return hfields(k('task', id), TASK_FIELDS)
end

-- a task's whole hash in one read: its fields as a table and the flat array (HGETALL)
local function load_task_flat(id)
  local flat = redis.call('HGETALL', k('task', id))
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t, flat
end

-- set fields of a flat field/value array (in place, appending missing ones)
local function flat_set(flat, values)
  local pos = {}
  for i = 1, #flat, 2 do pos[flat[i]] = i end
  for name, v in pairs(values) do
    local i = pos[name]
    if i then flat[i + 1] = v else flat[#flat + 1] = name; flat[#flat + 1] = v end
  end
end

--- @include "lib/base"
-- lib/affinity.lua: anti-affinity: the devices and hosts a retry prefers to avoid.

-- append `item` to a csv list of at most 8 (oldest dropped), without duplicates
local function csv_add(csv, item)
  if not item or item == '' then return csv or '' end
  local out = {}
  for v in string.gmatch(csv or '', '[^,]+') do
    if v ~= item then out[#out + 1] = v end
  end
  out[#out + 1] = item
  while #out > 8 do table.remove(out, 1) end
  return table.concat(out, ',')
end

-- remember that task `id` (fields t) lost an attempt on a device and host: a retry prefers
-- others (anti-affinity, read by the scheduler from the `avoid` hash while the task is queued)
local function avoid(id, t, device_id, host_id)
  t.avoid_devices = csv_add(t.avoid_devices, device_id)
  t.avoid_hosts = csv_add(t.avoid_hosts, host_id)
  redis.call('HSET', k('task', id), 'avoid_devices', t.avoid_devices, 'avoid_hosts', t.avoid_hosts)
end

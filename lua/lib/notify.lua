--- @include "lib/base"
-- lib/notify.lua: waking a blocked reader (scheduler, host inbox) and a host's control list.

local function wake(list)
  redis.call('LPUSH', list, '1')
  redis.call('LTRIM', list, '0', '0')
end

-- tell a host's daemon to act now (cancel requested, quarantine changed, session fenced, host
-- removed): it blocks on this list between lease renewals; at most 16 pending messages
local function ctl(host_id, msg)
  if not host_id or host_id == '' then return end
  local key = k('host', host_id, 'ctl')
  redis.call('LPUSH', key, msg)
  redis.call('LTRIM', key, '0', '15')
  redis.call('PEXPIRE', key, '600000')
end

--- @include "lib/base"
--- @include "lib/config"
-- lib/events.lua: the pool's event stream.

local _maxlen
local function emit(kind, ...)
  if not _maxlen then _maxlen = I(cfg('event_maxlen')) end
  redis.call('XADD', k('events'), 'MAXLEN', '~', _maxlen, '*', 'type', kind, ...)
end

-- the event field naming the multi-device task of a part (none for any other task); pass it
-- last to emit: emit(kind, ..., gang_field(t))
local function gang_field(t)
  if t.gang and t.gang ~= '' then return 'gang', t.gang end
end

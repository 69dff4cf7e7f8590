--- @include "lib/base"
--- @include "lib/events"
-- lib/suites.lua: the end of a suite (deviceq.suites).

-- end running suite `id` (hash key `sk`) once no shard is open: `done` when no test failed
-- or is still pending, else `failed`; it leaves suites:running; event suite_done. Returns
-- the status.
local function suite_end(id, sk)
  local c = hfields(sk, {'n_failed', 'n_pending'})
  local st = (tonumber(c.n_failed or '0') > 0 or tonumber(c.n_pending or '0') > 0) and 'failed' or 'done'
  redis.call('HSET', sk, 'status', st, 'finished_at', I(now_ms()))
  redis.call('SREM', k('suites', 'running'), id)
  emit('suite_done', 'suite', id, 'status', st)
  return st
end

--- @include "lib/base"
--- @include "lib/config"
--- @include "lib/args"
--- @include "lib/events"
--- @include "lib/notify"
--- @include "lib/constraints"
--- @include "lib/fence"
--- @include "gen/statuses"
-- preempt.lua: the leading scheduler decides that queued task URGENT takes device DEVICE from
-- the task VICTIM running on it. Everything is checked again here, atomically: URGENT is
-- queued, single-device, of a class that preempts, with no preemption pending; VICTIM holds
-- DEVICE's lease (assigned or dispatched), is single-device, of a preemptible class, of a
-- strictly lower priority, not already told to stop (in its grace), not cancelled, preempted
-- fewer than max_preemptions_per_task times; DEVICE is not booked by a person and satisfies
-- URGENT's constraints; fewer than max_preemptions_per_minute preemptions in the last minute.
-- Then VICTIM is told to stop (preempt_by, its class's grace; its host told at once on
-- host:ID:ctl, its next renewal answers `preempt:GRACE_MS`) and DEVICE is held for URGENT
-- (preempt_for; URGENT in preempt:handover): nothing is given the device until VICTIM's run has
-- ended (its report `preempted` or its lease's expiry releases it), then the scheduler assigns
-- it to URGENT (assign.lua refuses it to any other task while URGENT waits queued).
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     fence (the scheduler's leader epoch; required) urgent_id victim_id device_id
-- Keys     reads leader, paused, config, pclasses; writes task:ID, device:ID,
--          preemptible, preempt:handover,
--          preempt:recent, host:ID:ctl, events
-- Returns  "ok" (decided) or "err:REASON" (nothing written), REASON one of: paused
--          urgent_not_found urgent_not_queued urgent_multi_device urgent_no_class
--          urgent_cannot_preempt urgent_pending victim_not_found victim_not_running
--          victim_not_on_device victim_multi_device victim_no_class victim_not_preemptible
--          victim_not_lower victim_in_grace victim_cancelling victim_preempted_enough
--          device_not_found device_booked driver_type_mismatch missing_tag:TAG rate_limited
-- Errors   FENCED (not the current leader's epoch), INVALID (bad arguments).
local fence, uid, vid, did = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if #ARGV ~= 4 then return fail('INVALID', 'expected fence urgent_id victim_id device_id') end
if fence == '' then return fail('INVALID', 'a preemption is fenced: fence must be an epoch') end
if not valid_id(uid) or not valid_id(vid) or not valid_id(did) then
  return fail('INVALID', 'malformed task or device id')
end
if uid == vid then return fail('INVALID', 'a task cannot preempt itself') end
local fenced = check_fence(fence)
if fenced then return fenced end
if paused_for(fence) then return 'err:paused' end

-- a class's stored text PRIORITY:PREEMPTS:PREEMPTIBLE:GRACE_MS (deviceq.core.priority_classes)
local function class_of(name)
  if not name or name == '' then return nil end
  local raw = redis.call('HGET', k('pclasses'), name)
  if not raw then return nil end
  local p, pre, able, grace = raw:match('^(%d+):([01]):([01]):(%d+)$')
  if not p then return nil end
  return {priority = tonumber(p), preempts = pre == '1', preemptible = able == '1', grace = grace}
end

local U = {'status', 'class', 'priority', 'driver_type', 'tags', 'roles', 'gang', 'preempting'}
local u = hfields(k('task', uid), U)
if not u.status then return 'err:urgent_not_found' end
if u.status ~= 'queued' then return 'err:urgent_not_queued' end
if (u.roles or '') ~= '' or (u.gang or '') ~= '' then return 'err:urgent_multi_device' end
local uc = class_of(u.class)
if not uc then return 'err:urgent_no_class' end
if not uc.preempts then return 'err:urgent_cannot_preempt' end
if (u.preempting or '') ~= '' then return 'err:urgent_pending' end

local V = {'status', 'class', 'priority', 'device_id', 'host_id', 'lease_id', 'roles', 'gang',
  'preempt_by', 'cancel_requested', 'preemptions', 'attempt'}
local v = hfields(k('task', vid), V)
if not v.status then return 'err:victim_not_found' end
if not LEASED[v.status] then return 'err:victim_not_running' end
if v.device_id ~= did then return 'err:victim_not_on_device' end
if (v.roles or '') ~= '' or (v.gang or '') ~= '' then return 'err:victim_multi_device' end
local vc = class_of(v.class)
if not vc then return 'err:victim_no_class' end
if not vc.preemptible then return 'err:victim_not_preemptible' end
if (tonumber(v.priority) or 0) >= (tonumber(u.priority) or 0) then return 'err:victim_not_lower' end
if (v.preempt_by or '') ~= '' then return 'err:victim_in_grace' end
if v.cancel_requested == '1' then return 'err:victim_cancelling' end
local times = tonumber(v.preemptions) or 0
if times >= cfg('max_preemptions_per_task') then return 'err:victim_preempted_enough' end

local d = hfields(k('device', did), {'reserved_by', 'booked_until', 'driver_type', 'tags'})
if not d.driver_type then return 'err:device_not_found' end
if d.reserved_by ~= vid then return 'err:victim_not_on_device' end
if (d.booked_until or '') ~= '' then return 'err:device_booked' end
local ok, why = satisfies(u.driver_type or '', u.tags or '', d.driver_type, d.tags or '')
if not ok then return 'err:' .. why end

local now = now_ms()
local rk = k('preempt', 'recent')
redis.call('ZREMRANGEBYSCORE', rk, '-inf', I(now - 60000))
if redis.call('ZCARD', rk) >= cfg('max_preemptions_per_minute') then return 'err:rate_limited' end

local now_s = now_str()
redis.call('ZADD', rk, now_s, vid .. ':' .. now_s)
redis.call('PEXPIRE', rk, '120000')
redis.call('HSET', k('task', vid), 'preempt_by', uid, 'preempt_grace_ms', vc.grace,
  'preempt_requested_at', now_s, 'preemptions', I(times + 1), 'updated_at', now_s)
redis.call('ZREM', k('preemptible'), vid)
redis.call('HSET', k('task', uid), 'preempting', did, 'preempting_task', vid, 'updated_at', now_s)
redis.call('HSET', k('device', did), 'preempt_for', uid)
redis.call('ZADD', k('preempt', 'handover'), now_s, uid)
emit('preempted', 'task', vid, 'by', uid, 'lease', v.lease_id or '', 'host', v.host_id or '',
  'device', did, 'attempt', v.attempt or '0', 'grace_ms', vc.grace)
ctl(v.host_id, 'preempt')
return 'ok'

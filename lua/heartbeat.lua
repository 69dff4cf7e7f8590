--- @include "lib/base"
--- @include "lib/idle"
--- @include "lib/args"
--- @include "lib/events"
--- @include "lib/notify"
--- @include "lib/auth"
--- @include "lib/liveness"
--- @include "lib/eligibility"
--- @include "lib/gates"
--- @include "lib/attrs"
--- @include "lib/renewals"
--- @include "gen/args/heartbeat"
--- @include "gen/bounds"
-- heartbeat.lua: a host reports itself alive and what changed among its devices (a delta), or,
-- when Redis and the host disagree, the full snapshot of its devices in chunks.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     host_id token session('' = no daemon session) mode ver arg total n devices:
--          devices packed (deviceq.core.script_args HEARTBEAT, gen/args/heartbeat): one
--          cmsgpack array of n * DEV_N values, device after device, each device's fields in
--          this order; n <= 400 (the host sends 100 a call):
--   device_id    the device's id
--   driver_type  its driver type
--   tags         csv, sorted
--   state        idle | busy | offline
--   reason       why busy/offline, '' for idle; at most 200 bytes, no control characters
--   attrs        optional: the device's attributes as its host reports them (lib/attrs.lua),
--                entries one a line, `KEY=KIND:TEXT` (set) or `-KEY` (unset). In a delta the
--                ones that changed (a device whose attributes changed is carried even when its
--                state did not); in a full snapshot every one the host reports (those it
--                reported before and leaves out are removed; '' = none). Not given: unchanged.
--                An operator's value (device_attrs.lua) wins until the operator unsets it.
--          mode:
--          delta   ver = the version of the host's last heartbeat that got through, arg = the
--                  version this one sets, total = the devices the host has; the devices are
--                  the ones that changed since, a device the host no longer has given with
--                  state `gone` (driver_type, tags and reason ''). Applied only when ver is
--                  the host's stored version, else nothing is changed and the answer is
--                  `full`: the host sends its full snapshot.
--          full    one chunk of the full snapshot: ver = the snapshot's sync id, arg = 'first'
--                  for its first chunk (which starts the sync) or ''. Answers `part`, or
--                  `full` when the sync is not the host's current one (start again).
--          commit  the end of the full snapshot: ver = the sync id, arg = the version it sets,
--                  total = the devices of the snapshot, n = 0. Devices the host owned but left
--                  out become offline, at most 250 a call: `more` asks for another commit.
-- Keys     reads/writes host:ID, host:ID:devices, host:ID:held_devices, host:ID:quarantined,
--          host:ID:sync, host:ID:leftout, device:ID, device:ID:attrs, device:ID:attrs_at,
--          device:ID:attrs_host, attr_names, devices, idle, idle:c:*, caps, drivers, qdrivers,
--          devgen, events, sched:wake, task:ID, leases; reads config, gates
-- Returns  {status(ok | full | part | more), alive_devices, idle_assignable, draining(0|1,
--          operator), stopping(0|1), quarantined device ids (csv)}; the counts and flags are
--          those of `ok` (0 otherwise). alive_devices is the host's device count; idle_assignable
--          counts its devices that were idle candidates when last reported (device field
--          hb_idle: 1 when counted; a full snapshot counts them all as they are now, a delta
--          recounts the devices it carries). With leases given, a 7th element: renew.lua's
--          reply for them (per lease a flat triple {"ok"|"cancel"|"preempt:GRACE_MS",
--          expires_at_ms, lease_ms} or {"lost", REASON, 0}); without, the reply is as before.
-- Errors   AUTH (unknown host / wrong token), SUPERSEDED (not the current session),
--          INVALID (malformed mode, version, device, state, reason or attrs; a device with
--          more than 32 attributes), DEVICE_OWNED (a device
--          id registered by another host; nothing of this call is changed).
-- A heartbeat proves the host alive after a lost lease: it clears the host's `suspect` flag
-- and its devices' `held` marks (release_device lists them in host:ID:held_devices; those of
-- the absent ones too, which also leave a due or running health check: they are offline). A
-- device with an active reservation is never put among the idle candidates, whatever the
-- snapshot says; a quarantined or booked (reserved for a person, device_reserve.lua) device
-- neither, nor one under or failing a health check (device_health.lua).
local host_id, token, session = ARGV[1], ARGV[2], ARGV[3]
local hk, err, h = auth_host(host_id, token, session or '',
  {'suspect', 'draining', 'stopping', 'hb_ver', 'hb_sync', 'hb_idle', 'last_heartbeat'})
if not hk then return err end
local mode, ver, arg = ARGV[4], ARGV[5], ARGV[6]
local total, n = int_in(ARGV[7], 0, 1000000), int_in(ARGV[8], 0, 400)
if mode ~= 'delta' and mode ~= 'full' and mode ~= 'commit' then
  return fail('INVALID', 'mode must be delta, full or commit')
end
if not valid_id(ver) or (mode ~= 'full' and not valid_id(arg)) or (mode == 'full' and arg ~= 'first' and arg ~= '') then
  return fail('INVALID', 'malformed heartbeat version')
end
local A = (#ARGV == 9 or #ARGV == 10) and packed_items(ARGV[9], n, DEV_N)
if not total or not A or (mode == 'commit' and n ~= 0) then
  return fail('INVALID', 'bad argument count')
end
local L, ln
if #ARGV == 10 then
  L, ln = leases_in(ARGV[10])
  if not L then return fail('INVALID', 'malformed leases') end
end
local STATES = {idle = true, busy = true, offline = true}
local listed, owners, plans = {}, {}, {}
for i = 0, n - 1 do
  local b = i * DEV_N
  local did, state, reason = A[b + DEV_DEVICE_ID], A[b + DEV_STATE], A[b + DEV_REASON]
  if not valid_id(did) then return fail('INVALID', 'malformed device id') end
  if listed[did] then return fail('INVALID', 'device ' .. did .. ' is listed twice') end
  local attrs = A[b + DEV_ATTRS]
  if state == 'gone' and mode == 'delta' then
    if A[b + DEV_DRIVER_TYPE] ~= '' or A[b + DEV_TAGS] ~= '' or reason ~= '' or attrs then
      return fail('INVALID', 'a gone device has no driver_type, tags, reason or attrs')
    end
  else
    if not valid_id(A[b + DEV_DRIVER_TYPE]) then return fail('INVALID', 'malformed driver_type for ' .. did) end
    if not valid_tags(A[b + DEV_TAGS]) then return fail('INVALID', 'malformed tags for ' .. did) end
    if not STATES[state] then return fail('INVALID', 'device state must be idle, busy or offline') end
    if type(reason) ~= 'string' or #reason > MAX_REASON_BYTES or reason:find('%c') then
      return fail('INVALID', 'reason must be at most ' .. MAX_REASON_BYTES .. ' bytes without control characters')
    end
  end
  local owner, op_attrs
  if attrs then
    local d = redis.call('HMGET', k('device', did), 'host_id', 'attrs_op')
    owner, op_attrs = d[1], d[2]
  else
    owner = redis.call('HGET', k('device', did), 'host_id')
  end
  owners[did] = owner
  if owner and owner ~= host_id and state ~= 'gone' then
    return fail('DEVICE_OWNED', 'device ' .. did .. ' belongs to another host')
  end
  if attrs then
    local set, unset = attrs_parse(attrs)
    if not set then return fail('INVALID', unset .. ' (device ' .. did .. ')') end
    local plan, why = attrs_plan(did, 'host', set, unset, mode == 'full', op_attrs, not owner)
    if not plan then return fail('INVALID', why) end
    plans[did] = plan
  end
  listed[did] = true
end

-- the leases given, renewed (all arguments are checked): their triples end the reply
local renewed = L and renew_leases(L, ln, host_id, session or '')
local function reply(r)
  if renewed then r[7] = renewed end
  return r
end

local function refused() return reply({'full', 0, 0, 0, 0, ''}) end
if mode == 'delta' and h[4] ~= ver then return refused() end
if (mode == 'commit' or (mode == 'full' and arg ~= 'first')) and h[5] ~= ver then return refused() end

local now_s = now_str()
local qk = k('host', host_id, 'quarantined')
local hdk, synck, leftk  -- (the snapshot's keys: a delta does without them)
if mode ~= 'delta' then
  hdk, synck, leftk = k('host', host_id, 'devices'), k('host', host_id, 'sync'), k('host', host_id, 'leftout')
end
local q_any = mode == 'full' and redis.call('EXISTS', qk) == 1  -- any quarantined device to drop
local was_alive = heartbeat_fresh(h[7])
-- (a delta sets it with its version, in one write)
if mode ~= 'delta' then redis.call('HSET', hk, 'last_heartbeat', now_s) end
if h[1] and h[1] ~= '' then
  redis.call('HSET', hk, 'suspect', '')
  emit('host_alive', 'host', host_id, 'after', 'lost_lease')
end
local woke = not was_alive or (h[1] and h[1] ~= '')
local attrs_changed = false
local names, gates = {}, nil  -- (attribute name counts to flush; the pool's gates, once read)
local function count(hash, key, by)
  if redis.call('HINCRBY', k(hash), key, by) <= 0 then redis.call('HDEL', k(hash), key) end
end

-- the held marks left since the last heartbeat (release_device lists their devices)
local hsk = k('host', host_id, 'held_devices')
local held = redis.call('SMEMBERS', hsk)
for _, did in ipairs(held) do
  local dk = k('device', did)
  local d = redis.call('HMGET', dk, 'host_id', 'held')
  if d[1] == host_id and d[2] and d[2] ~= '' then
    redis.call('HSET', dk, 'held', '')
    emit('device_unheld', 'device', did, 'host', host_id, 'was', d[2])
    local _, added = refresh_idle(did, gate(did))
    if added then woke = true end
  end
end
if #held > 0 then redis.call('DEL', hsk) end

-- one device as reported: registered when new, its driver type, tags, state, reason and
-- attributes (plan: attrs_plan, or nil) stored, the gates checked when its attributes changed,
-- its held mark cleared, its place among the idle candidates decided. Returns 1 when it is an
-- idle candidate now, and -1 / 0 / 1: the change of that against before.
local function apply(did, driver, tags, state, reason, plan)
  local dk = k('device', did)
  local d = redis.call('HMGET', dk, 'state', 'reserved_by', 'quarantined', 'driver_type', 'tags',
    'held', 'reason', 'booked_until', 'health', 'hb_idle', 'gated')
  local was = d[10] == '1' and 1 or 0
  if not owners[did] then
    redis.call('SADD', k('devices'), did)
    redis.call('SADD', hdk or k('host', host_id, 'devices'), did)
    redis.call('HSET', dk, 'id', did, 'host_id', host_id, 'reserved_by', '', 'quarantined', '0',
      'consecutive_failures', '0', 'registered_at', now_s)
    d[3] = '0'
    emit('device_registered', 'device', did, 'host', host_id)
  end
  if mode == 'full' and owners[did] then
    if d[3] == '1' then redis.call('SADD', qk, did) elseif q_any then redis.call('SREM', qk, did) end
  end
  local changed = d[4] ~= driver or d[5] ~= tags
  if changed then
    attrs_changed = true
    if d[4] then
      count('caps', d[4] .. '|' .. (d[5] or ''), -1)
    end
    count('caps', driver .. '|' .. tags, 1)
    if d[4] ~= driver then
      if d[4] then count('drivers', d[4], -1) end
      count('drivers', driver, 1)
      if d[3] == '1' then
        if d[4] then count('qdrivers', d[4], -1) end
        count('qdrivers', driver, 1)
      end
    end
  end
  if changed then idle_remove(did, d[4], d[5]) end  -- out of its old class's idle set
  local gated = d[11] or ''
  if plan and attrs_apply(plan, now_s, names) > 0 then
    gates = gates or gates_load()
    if #gates.list > 0 or gated ~= '' then gated = gate_decide(did, gates, host_id, driver, gated) end
  end
  local cand, added = refresh_idle(did, {state = state, reserved_by = d[2], quarantined = d[3],
    held = '', booked_until = d[8], health = d[9], gated = gated, driver_type = driver,
    tags = tags}, changed)
  -- new among idle candidates, or re-scored so the scheduler re-reads changed attributes
  if added or (cand and changed) then woke = true end
  local c = cand and 1 or 0
  if d[1] ~= state or changed or (d[7] or '') ~= reason then
    redis.call('HSET', dk, 'driver_type', driver, 'tags', tags, 'state', state, 'reason', reason,
      'updated_at', now_s, 'hb_idle', I(c))
    emit('device_state', 'device', did, 'host', host_id, 'state', state, 'reason', reason)
  elseif c ~= was then
    redis.call('HSET', dk, 'hb_idle', I(c))
  end
  if d[6] and d[6] ~= '' then
    redis.call('HSET', dk, 'held', '')
    emit('device_unheld', 'device', did, 'host', host_id, 'was', d[6])
  end
  return c, c - was
end

-- a device owned by this host but absent from its devices is offline, and leaves every
-- transient state at once (held/suspect: nothing will come back to clear it; a health check
-- due or running: the host no longer checks it); a quarantine, a booking, an unhealthy result
-- and a lease (its expiry ends it) stay. Returns -1 when it was an idle candidate, else 0.
local function leave(did)
  local dk = k('device', did)
  local d = redis.call('HMGET', dk, 'state', 'held', 'health', 'quarantined', 'host_id', 'hb_idle')
  if d[5] ~= host_id then return 0 end
  if d[1] ~= 'offline' then
    redis.call('HSET', dk, 'state', 'offline', 'reason', 'not in the host snapshot', 'updated_at', now_s)
    emit('device_state', 'device', did, 'host', host_id, 'state', 'offline')
  end
  if d[2] and d[2] ~= '' then
    redis.call('HSET', dk, 'held', '')
    emit('device_unheld', 'device', did, 'host', host_id, 'was', d[2])
  end
  if d[3] == 'checking' then
    redis.call('HDEL', dk, 'health', 'health_started_at')
    emit('device_health_cleared', 'device', did, 'host', host_id, 'was', 'checking')
  end
  if d[4] == '1' then redis.call('SADD', qk, did) else redis.call('SREM', qk, did) end
  idle_remove(did)
  if d[6] ~= '1' then return 0 end
  redis.call('HSET', dk, 'hb_idle', '0')
  return -1
end

local function finish()
  if not was_alive then emit('host_alive', 'host', host_id) end
  attrs_names_flush(names)
  -- a device registered or its driver_type/tags changed: schedulers drop their attribute caches
  if attrs_changed then redis.call('INCR', k('devgen')) end
  if woke then wake(k('sched', 'wake')) end
end

local function answer(idle)
  idle = math.max(0, math.min(idle, total))
  return reply({'ok', total, idle, h[2] == '1' and 1 or 0, h[3] == '1' and 1 or 0,
    table.concat(redis.call('SMEMBERS', qk), ',')})
end

if mode == 'delta' then
  local idle = tonumber(h[6] or '0') or 0
  for i = 0, n - 1 do
    local b = i * DEV_N
    local did, state = A[b + DEV_DEVICE_ID], A[b + DEV_STATE]
    if state == 'gone' then
      if owners[did] == host_id then idle = idle + leave(did) end
    else
      local _, delta = apply(did, A[b + DEV_DRIVER_TYPE], A[b + DEV_TAGS], state, A[b + DEV_REASON],
        plans[did])
      idle = idle + delta
    end
  end
  redis.call('HSET', hk, 'last_heartbeat', now_s, 'hb_ver', arg, 'hb_idle', I(math.max(0, idle)))
  finish()
  return answer(idle)
end

if mode == 'full' then
  if arg == 'first' then
    redis.call('HSET', hk, 'hb_sync', ver, 'hb_sync_idle', '0', 'hb_sync_left', '')
    redis.call('HDEL', hk, 'hb_ver')
    redis.call('DEL', synck, leftk)
  end
  local idle = 0
  local ids = {}
  for i = 0, n - 1 do
    local b = i * DEV_N
    local did = A[b + DEV_DEVICE_ID]
    idle = idle + apply(did, A[b + DEV_DRIVER_TYPE], A[b + DEV_TAGS], A[b + DEV_STATE], A[b + DEV_REASON],
      plans[did])
    ids[i + 1] = did
  end
  if n > 0 then redis.call('SADD', synck, unpack(ids)) end
  redis.call('HINCRBY', hk, 'hb_sync_idle', I(idle))
  finish()
  return reply({'part', 0, 0, 0, 0, ''})
end

-- commit: the devices left out of the snapshot, then the version
local LEAVE_BUDGET = 250
local s = redis.call('HMGET', hk, 'hb_sync_left', 'hb_sync_idle')
if s[1] ~= '1' then
  redis.call('SDIFFSTORE', leftk, hdk, synck)
  redis.call('DEL', synck)
  redis.call('HSET', hk, 'hb_sync_left', '1')
end
local idle = tonumber(s[2] or '0') or 0
for _, did in ipairs(redis.call('SPOP', leftk, LEAVE_BUDGET)) do leave(did) end
if redis.call('EXISTS', leftk) == 1 then
  finish()
  return reply({'more', 0, 0, 0, 0, ''})
end
redis.call('HSET', hk, 'hb_ver', arg, 'hb_idle', I(idle))
redis.call('HDEL', hk, 'hb_sync', 'hb_sync_idle', 'hb_sync_left')
finish()
return answer(idle)

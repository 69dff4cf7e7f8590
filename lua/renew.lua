--- @include "lib/base"
--- @include "lib/args"
--- @include "lib/auth"
--- @include "lib/renewals"
--- @include "gen/args/renew"
-- renew.lua: the current lease holder extends one or more leases by lease_ttl from now (the
-- pool setting as it is now: a settings change applies at the next renewal of every lease);
-- renew_leases in lib/renewals.lua (heartbeat.lua renews the leases it is given alike).
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     host_id token session n(0..10000) leases: packed (deviceq.core.script_args RENEW,
--          gen/args/renew): one cmsgpack array of n * LEASE_N values, lease after lease:
--   task_id   the task
--   lease_id  its lease held by this host
-- Keys     reads host:ID, task:ID, config; writes task:ID, leases
-- Returns  per lease a flat triple: {"ok", expires_at_ms, lease_ms} or {"cancel", expires_at_ms,
--          lease_ms} (renewed, and a cancel was requested: stop the runner and report
--          `cancelled`), or {"preempt:GRACE_MS", expires_at_ms, lease_ms} (renewed, and the task
--          was preempted (preempt.lua): stop the runner, giving it GRACE_MS after its stop signal,
--          and report `preempted`), or {"lost", REASON, 0} with REASON one of not_found superseded expired
--          gang_ended (another part of its multi-device task ended) finished not_owner: the
--          lease is gone and the worker must stop that runner and report nothing.
-- Errors   AUTH (unknown host / wrong token), SUPERSEDED (not the current session),
--          INVALID (bad arguments).
local host_id, token, session = ARGV[1], ARGV[2], ARGV[3]
local hk, err = auth_host(host_id, token, session or '')
if not hk then return err end
local n = int_in(ARGV[4], 0, 10000)
if #ARGV ~= 5 or not n then return fail('INVALID', 'bad argument count') end
local A = leases_in(ARGV[5], n)
if not A then
  if packed_items(ARGV[5], n, LEASE_N) then return fail('INVALID', 'malformed task or lease id') end
  return fail('INVALID', 'bad argument count')
end
return renew_leases(A, n, host_id, session or '')

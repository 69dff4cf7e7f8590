--- @include "lib/base"
--- @include "lib/args"
--- @include "lib/notify"
--- @include "lib/auth"
--- @include "lib/claims"
-- claim.lua: the owning host takes up to `max` unexpired assigned attempts from its inbox to
-- `dispatched` (claim_inbox in lib/claims.lua; report.lua claims alike after its reports),
-- each with a fresh run lease (now + lease_ttl, read from the pool config now), stamped with
-- the claiming session. Exactly one caller gets each.
-- An assignment whose device was quarantined or held since it was committed is handed back
-- here (atomically, so the host never sees it; it counts against max_handbacks).
-- A multi-device task (GANG) becomes `dispatched` once each of its parts (GANG.ROLE) is claimed.
-- The work is split by time: once `budget_us` (default 2,500) is spent, checked every
-- CLAIM_EVERY (8) entries, the claim stops between two entries and, when the inbox still holds
-- some, says `more` (the caller claims again: HostClient.claim does, up to its max).
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     host_id token session max(1..1000) [budget_us(1..10000000)]
-- Keys     reads/writes host:ID, host:ID:inbox, task:ID, task:ID:attempts, task:ID:goal,
--          task:ID:tests,
--          device:ID, status:*, leases, events; on a hand-back also queue:SIG, sig:SIG, queues,
--          deadlines, avoid, idle, idle:c:*, cooling, LIMIT_COUNTERS, preemptible, host:ID:held_devices,
--          device:ID:history, sched:wake; reads config, gates
-- Returns  {lease_ms, task1, task2, ...[, 'more']}: the lease length granted and the claimed
--          tasks, each a flat field/value array of the task hash as read, then the fields the
--          claim set (a field may come twice: its last value is the current one), and for a
--          task with a list of tests (hash field `tests`) the field `tests_list` (task:ID:tests:
--          its test ids, one a line); last the
--          string 'more' when the budget stopped the claim with entries left in the inbox.
--          Stale inbox entries (expired, cancelled, reassigned) are dropped silently.
-- Errors   AUTH (unknown host / wrong token), SUPERSEDED (not the current session),
--          INVALID (bad max or budget).
local host_id, token, session = ARGV[1], ARGV[2], ARGV[3]
local hk, err = auth_host(host_id, token, session or '')
if not hk then return err end
local max = int_in(ARGV[4], 1, 1000)
if not max or (#ARGV ~= 4 and #ARGV ~= 5) then return fail('INVALID', 'max must be an integer 1-1000') end
local budget
if #ARGV == 5 then
  budget = int_in(ARGV[5], 1, 10000000)
  if not budget then return fail('INVALID', 'budget_us must be an integer 1-10000000') end
end
local out, refused = claim_inbox(host_id, session or '', max, budget)
if refused then wake(k('sched', 'wake')) end
return out

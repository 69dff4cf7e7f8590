--- @include "lib/base"
--- @include "lib/args"
-- heads.lua: read (never write) the head tasks of some queue buckets for the scheduler's
-- snapshot, with what it needs of each head, in one call instead of a command per bucket
-- and per head (a pass of fair_share over hundreds of tenant buckets reads ~200 of them).
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     flags (0-3: +1 each head's submitted_at, +2 its anti-affinity record), then
--          per bucket: SIG START STOP (ZRANGE ranks, STOP - START < 10000), at most 10000
-- Returns  per bucket in order a flat list: task_id, seq, submitted_at, avoid, ... ('' for a
--          field not asked for or not set)
-- Keys     reads queue:SIG, task:ID, avoid
-- Errors   INVALID (a bad count, flag, signature or range)
local n = #ARGV - 1
if n < 0 or n % 3 ~= 0 or n > 30000 then
  return fail('INVALID', 'expected flags then SIG START STOP triples (at most 10000)')
end
local flags = int_in(ARGV[1], 0, 3)
if not flags then return fail('INVALID', 'flags must be 0-3') end
for i = 2, #ARGV, 3 do
  local sig, lo, hi = ARGV[i], int_in(ARGV[i + 1], 0, 1000000000), int_in(ARGV[i + 2], 0, 1000000000)
  if not ARGV[i]:match('^[0-9a-f]+$') or #sig > 64 or not lo or not hi or hi < lo or hi - lo >= 10000 then
    return fail('INVALID', 'bad bucket range: SIG (hex) START STOP (0 <= STOP - START < 10000)')
  end
end
local want_sub, want_avoid = flags % 2 == 1, flags >= 2
local out = {}
for i = 2, #ARGV, 3 do
  local got = redis.call('ZRANGE', k('queue', ARGV[i]), ARGV[i + 1], ARGV[i + 2], 'WITHSCORES')
  local row = {}
  for j = 1, #got, 2 do
    local id = got[j]
    row[#row + 1] = id
    row[#row + 1] = got[j + 1]
    row[#row + 1] = want_sub and (redis.call('HGET', k('task', id), 'submitted_at') or '') or ''
    row[#row + 1] = want_avoid and (redis.call('HGET', k('avoid'), id) or '') or ''
  end
  out[#out + 1] = row
end
return out

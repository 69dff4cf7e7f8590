--- @include "lib/base"
--- @include "lib/args"
--- @include "gen/args/heads"
-- heads.lua: read (never write) the head tasks of some queue buckets for the scheduler's
-- snapshot, with what it needs of each head, in one call instead of a command per bucket
-- and per head (a pass of fair_share over hundreds of tenant buckets reads ~200 of them).
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     flags (0-3: +1 each head's submitted_at, +2 its anti-affinity record) n(0..10000)
--          buckets: packed (deviceq.core.script_args HEADS, gen/args/heads): one cmsgpack
--          array of n * BUCKET_N values, bucket after bucket:
--   sig    the bucket's signature (hex)
--   start  a number: the first ZRANGE rank
--   stop   a number: the last (STOP - START < 10000)
-- Returns  per bucket in order a flat list: task_id, seq, submitted_at, avoid, ... ('' for a
--          field not asked for or not set)
-- Keys     reads queue:SIG, task:ID, avoid
-- Errors   INVALID (a bad count, flag, signature or range)
local n = int_in(ARGV[2], 0, 10000)
local A = #ARGV == 3 and packed_items(ARGV[3], n, BUCKET_N)
if not A then
  return fail('INVALID', 'expected flags, n and n buckets packed (at most 10000)')
end
local flags = int_in(ARGV[1], 0, 3)
if not flags then return fail('INVALID', 'flags must be 0-3') end
for i = 0, n - 1 do
  local b = i * BUCKET_N
  local sig, lo, hi = A[b + BUCKET_SIG], A[b + BUCKET_START], A[b + BUCKET_STOP]
  if type(sig) ~= 'string' or not sig:match('^[0-9a-f]+$') or #sig > 64 or not whole_in(lo, 0, 1000000000)
      or not whole_in(hi, 0, 1000000000) or hi < lo or hi - lo >= 10000 then
    return fail('INVALID', 'bad bucket range: SIG (hex) START STOP (0 <= STOP - START < 10000)')
  end
end
local want_sub, want_avoid = flags % 2 == 1, flags >= 2
local out = {}
for i = 0, n - 1 do
  local b = i * BUCKET_N
  local got = redis.call('ZRANGE', k('queue', A[b + BUCKET_SIG]), I(A[b + BUCKET_START]),
    I(A[b + BUCKET_STOP]), 'WITHSCORES')
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

--- @include "lib/base"
--- @include "lib/args"
--- @include "lib/text"
--- @include "lib/auth"
--- @include "gen/args/attempt_artifacts"
-- attempt_artifacts.lua: a host records the files it uploaded to the artifact store for one
-- attempt it ran (name, size, sha256 each) and/or why the upload failed. Authenticated by the
-- host's token only (no session check: a restarted daemon finishes the uploads of attempts its
-- previous session ran), and only for an attempt whose record names this host (host_id).
-- The list replaces the record's `artifacts`; the error text replaces `artifacts_error`
-- ('' removes it). Files are recorded as given: the host normalised the names (relative, no
-- `..`, no absolute path) and this script refuses any other.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     host_id token task_id attempt error n files
--          error: at most 2000 bytes of UTF-8; n: 0-1000; files: packed
--          (deviceq.core.script_args ATTEMPT_ARTIFACTS, gen/args/attempt_artifacts): one
--          cmsgpack array of n * FILE_N values, file after file:
--   name    1-255 bytes of UTF-8, relative, '/'-separated, no empty, '.' or '..' segment, no
--           control characters
--   size    a number 0-10^15
--   sha256  64 lowercase hex digits
-- Keys     reads host:ID, task:ID:attempts; writes task:ID:attempts
-- Returns  the number of files recorded
-- Errors   INVALID (malformed argument), AUTH (wrong token, unknown host), NOT_FOUND (no
--          such attempt), AUTH also when the attempt was run by another host
local MAX_FILES, MAX_NAME, MAX_ERROR = 1000, 255, 2000
local host_id, token, task_id, attempt, err, n = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
if not valid_id(host_id) then return fail('INVALID', 'malformed host id') end
if not valid_id(task_id) then return fail('INVALID', 'malformed task id') end
if type(attempt) ~= 'string' or not attempt:match('^[1-9][0-9]?[0-9]?[0-9]?$') then
  return fail('INVALID', 'attempt must be an integer 1-9999')
end
if type(err) ~= 'string' or #err > MAX_ERROR or not valid_utf8(err) then
  return fail('INVALID', 'error must be at most ' .. MAX_ERROR .. ' bytes of UTF-8')
end
if type(n) ~= 'string' or not n:match('^[0-9][0-9]?[0-9]?[0-9]?$') or tonumber(n) > MAX_FILES then
  return fail('INVALID', 'file count must be 0-' .. MAX_FILES)
end
local count = tonumber(n)
local A = #ARGV == 7 and packed_items(ARGV[7], count, FILE_N)
if not A then return fail('INVALID', 'expected the files packed, ' .. FILE_N .. ' values per file') end

local function valid_name(s)
  if type(s) ~= 'string' or #s < 1 or #s > MAX_NAME or not valid_utf8(s) then return false end
  if s:find('[%z\1-\31\127\\]') or s:sub(1, 1) == '/' then return false end
  for seg in string.gmatch(s .. '/', '([^/]*)/') do
    if seg == '' or seg == '.' or seg == '..' then return false end
  end
  return true
end

local files, seen = {}, {}
for i = 0, count - 1 do
  local b = i * FILE_N
  local name, size, sha = A[b + FILE_NAME], A[b + FILE_SIZE], A[b + FILE_SHA256]
  if not valid_name(name) then return fail('INVALID', 'malformed file name (file ' .. (i + 1) .. ')') end
  if seen[name] then return fail('INVALID', 'file name given twice: ' .. name) end
  seen[name] = true
  if not whole_in(size, 0, 999999999999999) then
    return fail('INVALID', 'size must be an integer 0-10^15 (file ' .. (i + 1) .. ')')
  end
  if type(sha) ~= 'string' or #sha ~= 64 or sha:find('[^0-9a-f]') then
    return fail('INVALID', 'sha256 must be 64 lowercase hex digits (file ' .. (i + 1) .. ')')
  end
  files[#files + 1] = {name = name, size = size, sha256 = sha}
end

local ok, aerr = auth_host(host_id, token, nil)
if not ok then return aerr end
local ak = k('task', task_id, 'attempts')
local idx = tonumber(attempt) - 1
local raw = redis.call('LINDEX', ak, I(idx))
if not raw then return fail('NOT_FOUND', 'no attempt ' .. attempt .. ' of task ' .. task_id) end
local rec = cjson.decode(raw)
if rec.host_id ~= host_id then
  return fail('AUTH', 'attempt ' .. attempt .. ' of task ' .. task_id .. ' was not run by host ' .. host_id)
end
if count > 0 then
  rec.artifacts = files
else
  rec.artifacts = nil
end
if err ~= '' then rec.artifacts_error = err else rec.artifacts_error = nil end
redis.call('LSET', ak, I(idx), cjson.encode(rec))
return count

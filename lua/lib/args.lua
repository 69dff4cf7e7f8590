-- lib/args.lua: argument checks: ids, tags, whole and decimal numbers given as text or as
-- numbers; the packed items of a call (deviceq.core.script_args).

-- ids (task, device, host, lease, session, driver type, workflow): 1-128 of A-Z a-z 0-9 . _ -
-- starting with a letter or digit (Lua's $ anchors at the true end: no trailing newline)
local function valid_id(s)
  return type(s) == 'string' and #s >= 1 and #s <= 128 and s:match('^[A-Za-z0-9][A-Za-z0-9._-]*$') ~= nil
end

-- the optional `by` of a transition (who acts: an id; '' or nil = not recorded) as event
-- fields: {'by', by}, {} when not recorded, nil when malformed (the caller fails INVALID)
local function actor_fields(by)
  if by == nil or by == '' then return {} end
  if not valid_id(by) then return nil end
  return {'by', by}
end

local function valid_tag(s)
  return #s >= 1 and #s <= 64 and s:match('^[A-Za-z0-9][A-Za-z0-9._=/+-]*$') ~= nil
end

-- a tag list as stored: '' or comma-separated valid tags, sorted, distinct, at most 32
local function valid_tags(csv)
  if type(csv) ~= 'string' then return false end
  if csv == '' then return true end
  local prev, n = nil, 0
  for t in string.gmatch(csv .. ',', '([^,]*),') do
    if not valid_tag(t) or (prev and t <= prev) then return false end
    prev, n = t, n + 1
  end
  return n <= 32
end

-- a whole number given as text, within [lo, hi]
local function int_in(s, lo, hi)
  if type(s) ~= 'string' or not s:match('^%-?%d+$') then return nil end
  local n = tonumber(s)
  if not n or n < lo or n > hi then return nil end
  return n
end

-- a decimal number given as text, within [lo, hi]
local function num_in(s, lo, hi)
  if type(s) ~= 'string' or not s:match('^%-?%d+%.?%d*$') and not s:match('^%-?%d*%.%d+$') then
    return nil
  end
  local n = tonumber(s)
  if not n or n ~= n or n < lo or n > hi then return nil end
  return n
end

-- a whole number given as a number (a packed item's field), within [lo, hi]
local function whole_in(v, lo, hi)
  return type(v) == 'number' and v % 1 == 0 and v >= lo and v <= hi
end

-- the items of a call, packed (deviceq.core.script_args): one cmsgpack array of n * width
-- values, item after item; nil when it is not that (the caller fails INVALID)
local function packed_items(s, n, width)
  if type(s) ~= 'string' or not n then return nil end
  local ok, A = pcall(cmsgpack.unpack, s)
  if not ok or type(A) ~= 'table' or #A ~= n * width then return nil end
  return A
end

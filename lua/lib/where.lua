--- @include "lib/base"
-- lib/where.lua: --where clauses over a device's attributes (the Lua side of
-- deviceq.core.where: the same rule, tests/attributes/test_where_mirror.py compares the two).
-- A compiled clause is KEY<TAB>OP<TAB>VALUE... (OP = != < <= > >= in has), clauses one a line;
-- values and attributes are stored as KIND:TEXT (n number, v version, b boolean, s string).

local function where_split(text, sep)
  local out = {}
  for part in string.gmatch(text .. sep, '([^' .. sep .. ']*)' .. sep) do out[#out + 1] = part end
  return out
end

-- an attribute name; a value as deviceq.core.attributes.encode writes it (KIND:TEXT)
local function valid_attr_key(s)
  return type(s) == 'string' and #s <= 32 and s:match('^[a-z][a-z0-9_]*$') ~= nil
end
local function valid_attr_value(s)
  if type(s) ~= 'string' or #s < 2 or s:sub(2, 2) ~= ':' then return false end
  local kind, text = s:sub(1, 1), s:sub(3)
  if kind == 'b' then return text == '1' or text == '0' end
  if kind == 'n' then
    if #text > 32 or not text:match('^%-?[%d%.eE%+%-]+$') then return false end
    local n = tonumber(text)
    return n ~= nil and n == n and n >= -1e15 and n <= 1e15
  end
  if kind == 'v' then
    return #text <= 80 and text:match('^%d[%d%.]*%d$') ~= nil and text:find('.', 1, true) ~= nil
      and not text:find('..', 1, true)
  end
  -- (a string: at most 64 bytes, no control character or double quote; its UTF-8 is checked
  -- by the caller that has lib/text)
  if kind == 's' then return #text <= 64 and not text:find('[%c"]') end
  return false
end

local WHERE_OPS = {['='] = 1, ['!='] = 1, ['<'] = 1, ['<='] = 1, ['>'] = 1, ['>='] = 1, ['in'] = 16,
  has = 0}
-- compiled clauses as deviceq.core.where.compile_all writes them: at most 8 lines, each
-- KEY<TAB>OP<TAB>VALUE... with the values OP takes ('' is no clause)
local function valid_where(text)
  if type(text) ~= 'string' or #text > 4096 then return false end
  if text == '' then return true end
  local lines = where_split(text, '\n')
  if #lines > 8 then return false end
  for _, line in ipairs(lines) do
    local f = where_split(line, '\t')
    local most = WHERE_OPS[f[2] or '']
    if not most or not valid_attr_key(f[1]) then return false end
    local nv = #f - 2
    if (most == 0 and nv ~= 0) or (most > 0 and (nv < 1 or nv > most)) then return false end
    for j = 3, #f do
      if not valid_attr_value(f[j]) then return false end
    end
  end
  return true
end

-- a stored value as a version's parts (a version, or a number that reads as one), else nil
local function where_version(kind, text)
  if kind == 'v' then
    local parts = {}
    for p in text:gmatch('%d+') do parts[#parts + 1] = tonumber(p) end
    return parts
  end
  if kind ~= 'n' then return nil end
  if text:match('^%d+$') then return {tonumber(text)} end
  local a, b = text:match('^(%d+)%.(%d+)$')
  if a and #a <= 9 and #b <= 9 then return {tonumber(a), tonumber(b)} end
  return nil
end

-- -1, 0, 1 for comparable values; 'ne' for unequal booleans; nil for kinds that do not compare
local function where_compare(a, b)
  local ka, ta, kb, tb = a:sub(1, 1), a:sub(3), b:sub(1, 1), b:sub(3)
  if ka == 'b' or kb == 'b' then
    if ka ~= kb then return nil end
    return ta == tb and 0 or 'ne'
  end
  if ka == 'v' or kb == 'v' then
    local va, vb = where_version(ka, ta), where_version(kb, tb)
    if not va or not vb then return nil end
    for i = 1, math.max(#va, #vb) do
      local x, y = va[i] or 0, vb[i] or 0
      if x ~= y then return x < y and -1 or 1 end
    end
    return 0
  end
  if ka == 'n' and kb == 'n' then
    local x, y = tonumber(ta), tonumber(tb)
    if x == y then return 0 end
    return x < y and -1 or 1
  end
  if ka == 's' and kb == 's' then
    if ta == tb then return 0 end
    return ta < tb and -1 or 1
  end
  return nil
end

-- does the stored value `have` (nil: the device has no such attribute) satisfy the clause
-- (op, values)?
local function where_holds(have, op, values)
  if not have then return false end
  if op == 'has' then return true end
  if op == 'in' then
    for _, v in ipairs(values) do
      if where_compare(have, v) == 0 then return true end
    end
    return false
  end
  local c = where_compare(have, values[1])
  if op == '!=' then return c ~= 0 end
  if type(c) ~= 'number' then return false end
  if op == '=' then return c == 0 end
  if op == '<' then return c < 0 end
  if op == '<=' then return c <= 0 end
  if op == '>' then return c > 0 end
  if op == '>=' then return c >= 0 end
  return false
end

-- the first clause of `compiled` (lines) device `did`'s attributes fail, or nil when all hold
-- (one HMGET of the names the clauses use)
local function where_fails(did, compiled)
  if not compiled or compiled == '' then return nil end
  local clauses, names = {}, {}
  for _, line in ipairs(where_split(compiled, '\n')) do
    local f = where_split(line, '\t')
    clauses[#clauses + 1] = f
    names[#names + 1] = f[1]
  end
  local have = redis.call('HMGET', k('device', did, 'attrs'), unpack(names))
  for i, f in ipairs(clauses) do
    if not where_holds(have[i] or nil, f[2], {unpack(f, 3)}) then return f end
  end
  return nil
end

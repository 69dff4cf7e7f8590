--- @include "lib/args"
-- lib/roles.lua: a multi-device task's roles, as submitted.

-- a multi-device (gang) task's roles, as submitted: NAME=DRIVER:TAGS entries joined by ';'
-- (first = the leader; DRIVER '' = any; TAGS a sorted csv) -> {{name, driver, tags}, ...}, or
-- nil and why. Each role runs on a device of its own, as part task ID.NAME (gang_assign.lua).
local function parse_roles(spec)
  local out, seen = {}, {}
  for entry in string.gmatch(spec, '[^;]+') do
    local name, driver, tags = entry:match('^([^=]*)=([^:]*):?(.*)$')
    if not name or not valid_id(name) or #name > 32 then return nil, 'malformed role name' end
    if seen[name] then return nil, 'role ' .. name .. ' given twice' end
    if driver ~= '' and not valid_id(driver) then return nil, 'malformed driver_type of role ' .. name end
    if not valid_tags(tags) then return nil, 'malformed tags of role ' .. name end
    seen[name] = true
    out[#out + 1] = {name = name, driver = driver, tags = tags}
  end
  if #out < 1 or #out > 8 or #out ~= select(2, spec:gsub(';', '')) + 1 then
    return nil, 'a task has 1-8 roles'
  end
  return out
end

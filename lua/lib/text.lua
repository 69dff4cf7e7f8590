-- lib/text.lua: UTF-8 text: checked (valid_utf8) and cut (tail).

-- text that is valid UTF-8 (what every client decodes it as; no overlong forms, surrogates or
-- code points past U+10FFFF). Each well-formed sequence is replaced by an ASCII byte with
-- gsub (C speed, not a Lua loop per byte: a submit chunk may carry 1,000 goals of 16 KB); the
-- placeholder keeps neighbours apart, so no new sequence can form. Valid when no byte >= 128
-- is left.
local UTF8_SEQUENCES = {
  '[\194-\223][\128-\191]',
  '\224[\160-\191][\128-\191]', '[\225-\236\238\239][\128-\191][\128-\191]',
  '\237[\128-\159][\128-\191]',
  '\240[\144-\191][\128-\191][\128-\191]', '[\241-\243][\128-\191][\128-\191][\128-\191]',
  '\244[\128-\143][\128-\191][\128-\191]',
}
local function valid_utf8(s)
  if not s:find('[\128-\255]') then return true end
  for _, seq in ipairs(UTF8_SEQUENCES) do s = s:gsub(seq, '_') end
  return not s:find('[\128-\255]')
end

-- the last n bytes of s at most, never starting inside a UTF-8 sequence
local function tail(s, n)
  local i = #s - n + 1
  if i <= 1 then return s end
  while i <= #s do
    local b = s:byte(i)
    if b < 128 or b > 191 then break end
    i = i + 1
  end
  return s:sub(i)
end

-- graphcap.json: a small strict JSON reader and the string quoting of its
-- writer, for the safetensors header (graphcap.safetensors) and the trace
-- files the tests read.

local error, ipairs, setmetatable, string, table, tonumber, utf8 =
      error, ipairs, setmetatable, string, table, tonumber, utf8
_ENV = nil

local json = {}

-- The value null decodes to (a table of its own, so that a map keeps a key
-- whose value is null).
json.null = setmetatable({}, {__name = "json null"})
-- The metatable of every decoded object, which tells {} from [].
json.object = {__name = "json object"}

local MAX_DEPTH = 64  -- arrays and objects nested deeper are refused

local escapes = {['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n",
                 r = "\r", t = "\t"}

-- The value of the JSON text s (RFC 8259, strictly: one value with only
-- whitespace around it, no trailing commas, no comments, no duplicate keys
-- in an object, strings of valid UTF-8 and escapes, surrogates paired).
-- Objects and arrays become tables (objects with the metatable
-- json.object), null json.null; a number without a
-- fraction or an exponent is an integer when it fits one. Raises
-- "<what> at byte <n>" (n counts from 1).
function json.decode (s)
  local pos, depth = 1, 0
  local function fail (what) error(string.format("%s at byte %d", what, pos), 0) end
  local function ws () pos = s:find("[^ \t\r\n]", pos) or #s + 1 end
  local function lit (word, v)
    if s:sub(pos, pos + #word - 1) ~= word then fail("bad literal") end
    pos = pos + #word
    return v
  end
  local function hex4 (at)
    local h = s:match("^%x%x%x%x", at)
    if not h then pos = at - 2; fail("bad \\u escape") end
    return tonumber(h, 16)
  end
  local value
  local function str ()
    local out = {}
    pos = pos + 1
    while true do
      local j = s:find("[\0-\31\"\\]", pos)
      if j == nil then pos = #s + 1; fail("unterminated string") end
      local run = s:sub(pos, j - 1)
      if not utf8.len(run) then fail("a string that is not UTF-8") end
      out[#out + 1] = run
      pos = j
      local c = s:sub(pos, pos)
      if c == '"' then pos = pos + 1; return table.concat(out) end
      if c ~= "\\" then fail("control character in a string") end
      local e = s:sub(pos + 1, pos + 1)
      if e == "u" then
        local u = hex4(pos + 2)
        pos = pos + 6
        if u >= 0xD800 and u <= 0xDBFF then  -- a high surrogate: its low one follows
          if s:sub(pos, pos + 1) ~= "\\u" then fail("lone surrogate in a \\u escape") end
          local lo = hex4(pos + 2)
          if lo < 0xDC00 or lo > 0xDFFF then fail("lone surrogate in a \\u escape") end
          u = 0x10000 + (u - 0xD800) * 0x400 + (lo - 0xDC00)
          pos = pos + 6
        elseif u >= 0xDC00 and u <= 0xDFFF then
          fail("lone surrogate in a \\u escape")
        end
        out[#out + 1] = utf8.char(u)
      elseif escapes[e] then
        out[#out + 1] = escapes[e]
        pos = pos + 2
      else
        fail("bad escape")
      end
    end
  end
  local function num ()  -- -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][-+]?[0-9]+)?
    local p = pos + (s:sub(pos, pos) == "-" and 1 or 0)
    local int = s:match("^%d+", p)
    if not int or #int > 1 and int:sub(1, 1) == "0" then fail("bad number") end
    p = p + #int
    for _, part in ipairs{{"^%.", "^%.%d+"}, {"^[eE]", "^[eE][-+]?%d+"}} do
      if s:find(part[1], p) then
        local m = s:match(part[2], p)
        if not m then fail("bad number") end
        p = p + #m
      end
    end
    local v = tonumber(s:sub(pos, p - 1))
    pos = p
    return v
  end
  local function seq (close, item)
    local t = {}
    depth = depth + 1
    if depth > MAX_DEPTH then fail("nesting deeper than " .. MAX_DEPTH) end
    pos = pos + 1
    ws()
    if s:sub(pos, pos) == close then pos = pos + 1; depth = depth - 1; return t end
    while true do
      item(t)
      ws()
      local c = s:sub(pos, pos)
      if c == close then pos = pos + 1; depth = depth - 1; return t end
      if c ~= "," then fail("expected ',' or '" .. close .. "'") end
      pos = pos + 1
      ws()
    end
  end
  function value ()
    ws()
    local c = s:sub(pos, pos)
    if c == "{" then
      return setmetatable(seq("}", function (t)
        if s:sub(pos, pos) ~= '"' then fail("expected a string key") end
        local at = pos
        local k = str()
        if t[k] ~= nil then pos = at; fail(string.format("duplicate key %s", json.quote(k))) end
        ws()
        if s:sub(pos, pos) ~= ":" then fail("expected ':'") end
        pos = pos + 1
        t[k] = value()
      end), json.object)
    elseif c == "[" then
      return seq("]", function (t) t[#t + 1] = value() end)
    elseif c == '"' then return str()
    elseif c == "t" then return lit("true", true)
    elseif c == "f" then return lit("false", false)
    elseif c == "n" then return lit("null", json.null)
    elseif c:match("[-%d]") then return num()
    end
    fail(c == "" and "unexpected end" or string.format("unexpected %q", c))
  end
  local v = value()
  ws()
  if pos <= #s then fail("text after the value") end
  return v
end

-- s as a JSON string literal, as serde_json writes one (the writer of
-- Python's safetensors): '"' and '\' escaped, \b \f \n \r \t, the other
-- control characters as \u00XX, everything else (UTF-8) as it is.
local quoted = {['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f", ["\n"] = "\\n",
                ["\r"] = "\\r", ["\t"] = "\\t"}
function json.quote (s)
  return '"' .. s:gsub('[\0-\31"\\]', function (c)
    return quoted[c] or string.format("\\u%04x", c:byte())
  end) .. '"'
end

return json

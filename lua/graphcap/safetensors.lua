-- graphcap.safetensors: gc.save and gc.load, tensors in the safetensors
-- format (the one of Python's safetensors, safetensors.torch.save_file):
--   8 bytes    N, the header's length, an unsigned little-endian integer
--   N bytes    the header: a JSON object, padded with spaces; per tensor
--              name {"dtype": "F32", "shape": [2, 3], "data_offsets":
--              [begin, end]}, and "__metadata__": {string: string}
--   the rest   the data: each tensor's bytes, little-endian and row-major,
--              at [begin, end) of it; together they cover it exactly.
-- gc.save writes what Python's writer writes (the same bytes for the same
-- tensors and metadata of one entry); gc.load checks everything the header
-- says against the file before it reads any data, and never reads past it.

local core = require "graphcap.core"
local util = require "graphcap.util"
local json = require "graphcap.json"
core._facade()

local error, getmetatable, io, ipairs, math, os, pairs, pcall, setmetatable, string, table,
      tostring, type, utf8 = error, getmetatable, io, ipairs, math, os, pairs, pcall,
      setmetatable, string, table, tostring, type, utf8
_ENV = nil

local raise = util.raise
local Tensor = core._metatables.Tensor

local M = {}

-- The dtypes graphcap holds: safetensors' name -> graphcap's, and back.
local to_gc = {F32 = "f32", BF16 = "bf16"}
local to_st = {f32 = "F32", bf16 = "BF16"}
local size_of = {F32 = 4, BF16 = 2}
-- The other dtypes of the format, refused by name.
local others = {}
for _, d in ipairs({"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F4", "F6_E2M3",
                    "F6_E3M2", "I16", "U16", "F16", "I32", "U32", "C64", "F64", "I64",
                    "U64"}) do
  others[d] = true
end
-- The order Python's writer puts tensors in: by dtype, the wider first
-- (F32 before BF16), then by name.
local rank = {F32 = 1, BF16 = 2}

local MAX_HEADER = 100000000  -- the largest header Python's safetensors reads
local MAXDIM, MAXNUMEL = 4, 1 << 40

local function is_open (t) return (pcall(t.dim, t)) end

-- The message of error err without the position of the user's line that
-- the facade and the binding put first (a message to quote in another).
local function bare (err)
  local at = core._where()
  err = tostring(err)
  return err:sub(1, #at) == at and err:sub(#at + 1) or err
end

-- The name k as messages quote it.
local function q (k) return string.format("%q", k) end

local function shape_str (shape)
  local s = {}
  for i, d in ipairs(shape) do s[i] = tostring(d) end
  return "[" .. table.concat(s, ", ") .. "]"
end

-- gc.save(path, tensors [, metadata]): write the map name -> tensor, and
-- the map metadata (strings to strings, safetensors' "__metadata__"), as a
-- safetensors file. Refused while capturing (it reads the tensors back).
function M.save (path, tensors, metadata)
  if type(path) ~= "string" then raise("save: path must be a string, got %s", type(path)) end
  if type(tensors) ~= "table" or getmetatable(tensors) == Tensor then
    raise("save: tensors must be a table of name -> tensor, got %s",
          getmetatable(tensors) == Tensor and "a tensor" or type(tensors))
  end
  local entries = {}
  for k, t in pairs(tensors) do
    if type(k) ~= "string" then
      raise("save: tensor names must be strings, got the %s key %s", type(k), tostring(k))
    end
    if k == "__metadata__" then raise("save: \"__metadata__\" is the format's, not a tensor name") end
    if not utf8.len(k) then raise("save: tensor name %s is not UTF-8", q(k)) end
    if getmetatable(t) ~= Tensor then
      raise("save: tensors[%s] must be a tensor, got %s", q(k), type(t))
    end
    if not is_open(t) then raise("save: tensors[%s] is a closed tensor", q(k)) end
    entries[#entries + 1] = {name = k, t = t, dtype = to_st[t:dtype()], shape = t:shape()}
  end
  local meta = {}
  if metadata ~= nil then
    if type(metadata) ~= "table" then
      raise("save: metadata must be a table of string -> string, got %s", type(metadata))
    end
    for k, v in pairs(metadata) do
      if type(k) ~= "string" or type(v) ~= "string" then
        raise("save: metadata must map strings to strings; entry %s is %s", tostring(k), type(v))
      end
      if not utf8.len(k) or not utf8.len(v) then
        raise("save: metadata entry %s is not UTF-8", q(k))
      end
      meta[#meta + 1] = k
    end
    table.sort(meta)
  end
  if core.is_capturing() then
    raise("save: reading tensors back is not allowed while a capture is open")
  end
  table.sort(entries, function (a, b)
    if a.dtype ~= b.dtype then return rank[a.dtype] < rank[b.dtype] end
    return a.name < b.name
  end)
  -- The header, as serde_json writes Python's: compact, metadata first.
  local parts, offset = {}, 0
  if metadata ~= nil then
    local kv = {}
    for i, k in ipairs(meta) do kv[i] = json.quote(k) .. ":" .. json.quote(metadata[k]) end
    parts[1] = '"__metadata__":{' .. table.concat(kv, ",") .. "}"
  end
  for _, e in ipairs(entries) do
    local n = e.t:numel() * size_of[e.dtype]
    local dims = {}
    for i, d in ipairs(e.shape) do dims[i] = string.format("%d", d) end
    parts[#parts + 1] = string.format('%s:{"dtype":"%s","shape":[%s],"data_offsets":[%d,%d]}',
                                      json.quote(e.name), e.dtype, table.concat(dims, ","),
                                      offset, offset + n)
    offset = offset + n
  end
  local header = "{" .. table.concat(parts, ",") .. "}"
  header = header .. string.rep(" ", (8 - #header % 8) % 8)
  local f, err = io.open(path, "wb")
  if not f then raise("save: cannot write %s: %s", q(path), err) end
  local ok, werr = pcall(function ()
    local w, e = f:write(string.pack("<I8", #header), header)
    for _, ent in ipairs(entries) do
      if not w then break end
      w, e = f:write(ent.t:tobytes())
    end
    if not w then error(e, 0) end
    w, e = f:close()
    if not w then error(e, 0) end
  end)
  if not ok then
    pcall(f.close, f)
    os.remove(path)
    raise("save: cannot write %s: %s", q(path), bare(werr))
  end
end

-- The checked entry of tensor k of the header of file p (size: the data's
-- bytes) for the function op: {name, dtype, shape, b, e}.
local function entry (op, p, k, v, size)
  local function bad (fmt, ...) raise(op .. ": %s: tensor %s " .. fmt, q(p), q(k), ...) end
  if type(v) ~= "table" or getmetatable(v) ~= json.object then
    bad("must be an object {dtype, shape, data_offsets}")
  end
  for f in pairs(v) do
    if f ~= "dtype" and f ~= "shape" and f ~= "data_offsets" then
      bad("has an unknown field %s (expected dtype, shape, data_offsets)", q(f))
    end
  end
  local dt, shape, offs = v.dtype, v.shape, v.data_offsets
  if type(dt) ~= "string" then bad("has no dtype string") end
  if not to_gc[dt] then
    if others[dt] then bad("has dtype %s; graphcap reads F32 and BF16", dt) end
    bad("has an unknown dtype %s", q(dt))
  end
  if type(shape) ~= "table" or getmetatable(shape) == json.object then
    bad("has no shape (an array of sizes)")
  end
  if #shape > MAXDIM then bad("has %d dims; graphcap's tensors have 0 to 4", #shape) end
  local numel = 1
  for i = 1, #shape do
    local d = shape[i]
    if math.type(d) ~= "integer" or d < 0 then
      bad("has shape entry #%d %s; sizes are integers >= 0", i, tostring(d))
    end
    if d > 0 and numel > MAXNUMEL // d then  -- the engine's limit, which keeps numel exact
      bad("has shape %s: more than 2^40 elements, graphcap's most", shape_str(shape))
    end
    numel = numel * d
  end
  if type(offs) ~= "table" or getmetatable(offs) == json.object or #offs ~= 2 or
     math.type(offs[1]) ~= "integer" or math.type(offs[2]) ~= "integer" then
    bad("has no data_offsets [begin, end] of two integers")
  end
  local b, e = offs[1], offs[2]
  if b < 0 or e < b then bad("has data_offsets [%d, %d]: expected 0 <= begin <= end", b, e) end
  if e > size then
    bad("has data_offsets [%d, %d] past the end of the data (%d bytes)", b, e, size)
  end
  if e - b ~= numel * size_of[dt] then
    bad("%s %s needs %d bytes, but its data_offsets [%d, %d] hold %d", dt, shape_str(shape),
        numel * size_of[dt], b, e, e - b)
  end
  return {name = k, dtype = dt, shape = shape, b = b, e = e}
end

-- The file at path, for the function op: its tensors (name -> tensor) when
-- with_data, else its metadata (string -> string, or nil). Every check on
-- the header, its JSON, dtypes, shapes and offsets is made before any data
-- is read.
local function read (op, path, with_data)
  if type(path) ~= "string" then raise(op .. ": path must be a string, got %s", type(path)) end
  if with_data and core.is_capturing() then
    raise(op .. ": writing tensors from the host is not allowed while a capture is open")
  end
  local f, err = io.open(path, "rb")
  if not f then raise(op .. ": cannot open %s: %s", q(path), err) end
  local ok, a = pcall(function ()
    local size = f:seek("end")
    if not size or not f:seek("set", 0) then
      raise(op .. ": %s: cannot seek in it (not a regular file?)", q(path))
    end
    if size < 8 then
      raise(op .. ": %s is not a safetensors file: %d bytes, less than the 8 of the header length",
            q(path), size)
    end
    local len, rerr = f:read(8)
    if len == nil or #len ~= 8 then
      raise(op .. ": %s: cannot read it: %s", q(path), tostring(rerr or "it ended"))
    end
    local n = string.unpack("<i8", len)
    if n < 0 or n > MAX_HEADER then
      raise(op .. ": %s: header length %s is over the %d bytes safetensors allows (corrupt file?)",
            q(path), n < 0 and "of 2^63 or more" or string.format("%d", n), MAX_HEADER)
    end
    if n > size - 8 then
      raise(op .. ": %s is truncated: its header length is %d bytes, but %d follow the length",
            q(path), n, size - 8)
    end
    local header = f:read(n) or ""
    if #header ~= n then raise(op .. ": %s: the file ended inside its header", q(path)) end
    if header:sub(1, 1) ~= "{" then
      raise(op .. ": %s: the header does not start with '{' (not a safetensors file?)", q(path))
    end
    local jok, doc = pcall(json.decode, header)
    if not jok then raise(op .. ": %s: the header is not valid JSON: %s of the header", q(path), doc) end
    local data = size - 8 - n
    local entries, meta = {}, nil
    for k, v in pairs(doc) do
      if k == "__metadata__" then
        if type(v) ~= "table" or getmetatable(v) ~= json.object then
          raise(op .. ": %s: __metadata__ must be an object of strings", q(path))
        end
        for mk, mv in pairs(v) do
          if type(mv) ~= "string" then
            raise(op .. ": %s: __metadata__ entry %s is not a string", q(path), q(mk))
          end
        end
        meta = v
      else
        entries[#entries + 1] = entry(op, path, k, v, data)
      end
    end
    -- The tensors cover the data exactly, in offset order.
    table.sort(entries, function (x, y)
      if x.b ~= y.b then return x.b < y.b end
      if x.e ~= y.e then return x.e < y.e end
      return x.name < y.name
    end)
    local at, prev = 0, nil
    for _, e in ipairs(entries) do
      if e.b < at then
        raise(op .. ": %s: tensors %s and %s overlap (data_offsets [%d, %d] and [%d, %d])", q(path),
              q(prev.name), q(e.name), prev.b, prev.e, e.b, e.e)
      elseif e.b > at then
        raise(op .. ": %s: bytes %d to %d of the data belong to no tensor (before %s)", q(path),
              at, e.b, q(e.name))
      end
      at, prev = e.e, e
    end
    if at ~= data then
      raise(op .. ": %s: the tensors cover %d bytes of data, but the file holds %d after the header",
            q(path), at, data)
    end
    if not with_data then return meta and setmetatable(meta, nil) end
    local out = {}
    for _, e in ipairs(entries) do
      local s = ""
      if e.e > e.b then
        f:seek("set", 8 + n + e.b)
        s = f:read(e.e - e.b)
        if s == nil or #s ~= e.e - e.b then
          raise(op .. ": %s: the file ended inside tensor %s (did it change?)", q(path), q(e.name))
        end
      end
      local tok, t = pcall(function ()  -- out of device memory, say
        local t = core.empty(e.shape, to_gc[e.dtype])
        return #s > 0 and t:_write_bytes(s) or t
      end)
      if not tok then raise(op .. ": %s: tensor %s: %s", q(path), q(e.name), bare(t)) end
      out[e.name] = t
    end
    return out
  end)
  f:close()
  if not ok then
    if type(a) == "string" and a:sub(1, #core._where()) == core._where() then
      error(a, 0)  -- ours: it names the user's line already
    end
    raise(op .. ": %s: %s", q(path), tostring(a))
  end
  return a
end

-- gc.load(path) -> the tensors (name -> tensor), as safetensors' load_file.
function M.load (path) return read("load", path, true) end

-- gc.load_metadata(path) -> the header's metadata (string -> string), or
-- nil without one, as safe_open's metadata(); no tensor is read.
function M.load_metadata (path) return read("load_metadata", path, false) end

return M

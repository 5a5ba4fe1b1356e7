"""Avro binary encoders and decoders compiled per schema: the fast path under `SchemaRegistry`.

fastavro's schemaless writer and reader walk the parsed schema for every message (about 20 µs each way
for an `LLMCall`, most of the typed codec's cost: bench/bus_bench.py). Here each record schema is turned
once into Python source, one straight-line function per named record, that writes zigzag varints,
length-prefixed bytes and little-endian floats into a list of chunks (or reads them back by offset).

The fast path is exact or absent: it only takes values of exactly the types fastavro writes for a schema
(`str` for string, `int` in range for int/long, `float` for float/double, `bytes`, `list` or `tuple`,
`dict`, `bool`, `None`) and records with exactly the schema's fields. Anything else (an `int` given for
a double, a wrong type, a corrupt or truncated body) raises `Fallback`, and the caller hands the same
record or message to fastavro, which encodes it or names the error as before. A codec can also be bound
to a class (`Binding`: `schemas.events` binds each event class), writing from and reading into its
objects with no dict in between.
The output is byte-identical to fastavro's (tests/unit/bus/test_avro_binary.py checks both ways on
random records of every schema). A schema using what is not compiled here (`fixed`, unions other than
`["null", X]`) gets no compiled codec and always goes through fastavro.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

Encoder = Callable[..., bytes]
Decoder = Callable[[bytes, int], Any]


@dataclass(frozen=True)
class Binding:
    """How a class maps onto a record schema, for a codec that writes from and reads into its objects
    (no intermediate dict): per Avro field, the attribute it comes from (None: the field holds `constants`'
    value, which decoding checks) and the functions that convert the value each way (None: unchanged).
    Decoding builds the object with `object.__new__` and fills its `__dict__`, as `schemas.envelope` does."""

    cls: type
    fields: Mapping[str, tuple[str, Callable[[Any], Any] | None, Callable[[Any], Any] | None]]
    constants: Mapping[str, Any]
    #: Bindings of the records nested in this one, by record name (without namespace): their fields hold
    #: the bound objects themselves.
    nested: Mapping[str, Binding] = field(default_factory=dict)

    def covers(self, schema: Mapping[str, Any]) -> bool:
        return {f["name"] for f in schema["fields"]} == {*self.fields, *self.constants}

    def all_bound(self) -> dict[str, Binding]:
        """This binding's nested ones and theirs, by record name."""
        found = dict(self.nested)
        for inner in self.nested.values():
            found.update(inner.all_bound())
        return found


class Fallback(Exception):
    """The compiled codec does not handle this value or message: fastavro will."""


class _NotCompiled(Exception):
    """The schema uses a type this module does not compile."""


_INT_RANGE: Final = (-(2**31), 2**31 - 1)
_LONG_RANGE: Final = (-(2**63), 2**63 - 1)
_SMALL: Final = tuple(bytes([n]) for n in range(128))
_PRIMITIVES: Final = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


def _varint(n: int) -> bytes:
    """An unsigned varint (the zigzag is applied by the caller); one to three bytes without a loop."""
    if n < 128:
        return _SMALL[n]
    if n < 16384:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    if n < 2097152:
        return bytes(((n & 0x7F) | 0x80, ((n >> 7) & 0x7F) | 0x80, n >> 14))
    out = bytearray()
    while n > 127:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_length(data: bytes, pos: int) -> tuple[int, int]:
    """A length (a long that must not be negative)."""
    n, pos = _read_long(data, pos)
    if n < 0:
        raise Fallback("negative length")
    return n, pos


def _read_long(data: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint at `pos`: (value, position after it)."""
    b = data[pos]
    n = b & 0x7F
    if b & 0x80:
        b = data[pos + 1]
        n |= (b & 0x7F) << 7
        pos += 1
        shift = 14
        while b & 0x80:
            pos += 1
            b = data[pos]
            n |= (b & 0x7F) << shift
            shift += 7
            if shift > 70:
                raise Fallback("varint too long")
    return (n >> 1) ^ -(n & 1), pos + 1


_PACK_F: Final = struct.Struct("<f").pack
_PACK_D: Final = struct.Struct("<d").pack
_UNPACK_F: Final = struct.Struct("<f").unpack_from
_UNPACK_D: Final = struct.Struct("<d").unpack_from


class _Compiler:
    """Writes the source of one schema's encoder and decoder: a function per named record (so nested and
    recursive records are a call), straight-line code per field."""

    def __init__(self) -> None:
        self.scope: dict[str, Any] = {
            "_varint": _varint, "_SMALL": _SMALL, "_LEN": _SMALL[::2], "_C": tuple(chr(2 * n) for n in range(64)),
            "_read_long": _read_long, "_read_length": _read_length, "_F": Fallback, "_pf": _PACK_F, "_pd": _PACK_D,
            "_uf": _UNPACK_F, "_ud": _UNPACK_D, "_IMIN": _INT_RANGE[0], "_IMAX": _INT_RANGE[1],
            "_LMIN": _LONG_RANGE[0], "_LMAX": _LONG_RANGE[1],
        }
        self.named: dict[str, dict[str, Any]] = {}
        self.bound: dict[str, Binding] = {}
        self.functions: dict[str, str] = {}
        self.counter = 0

    def fresh(self, stem: str) -> str:
        self.counter += 1
        return f"{stem}{self.counter}"

    def resolve(self, schema: Any) -> Any:
        if isinstance(schema, str) and schema not in _PRIMITIVES:
            if schema not in self.named:
                raise _NotCompiled(f"unknown named type {schema}")
            return self.named[schema]
        if isinstance(schema, dict) and schema.get("type") in _PRIMITIVES and len(schema) == 1:
            return schema["type"]
        return schema

    def record_function(self, schema: dict[str, Any], binding: Binding | None = None) -> str:
        """The name of the encoder and decoder of a record (compiled on first use); with a binding, they
        write from and read into the bound class's objects."""
        name = schema["name"]
        self.named[name] = schema
        if binding is not None and not binding.covers(schema):
            raise _NotCompiled(f"binding of {binding.cls.__name__} does not cover the fields of {name}")
        key = f"_rec_{name.replace('.', '_')}" + ("_bound" if binding else "")
        if key not in self.functions:
            self.functions[key] = ""  # reserved first: a recursive record calls itself
            enc, dec, values = self.record_body(schema, binding)
            head = f"if type(r) is not dict or len(r) != {len(schema['fields'])}: raise _F"
            if binding is None:
                end = [f"    return {{{values}}}, p"]
            else:
                self.scope["_new"], self.scope[f"_cls{key}"] = object.__new__, binding.cls
                end = [f"    o = _new(_cls{key})", f"    o.__dict__.update({{{values}}})", "    return o, p"]
            self.functions[key] = "\n".join([f"def _e{key}(r, a):", *([] if binding else [f"    {head}"]), *enc,
                                             f"def _d{key}(d, p):", *dec, *end])
        return key

    def record_body(self, schema: dict[str, Any], binding: Binding | None) -> tuple[list[str], list[str], str]:
        """The field by field statements of a record's encoder and decoder, and its decoded values."""
        enc: list[str] = []
        dec: list[str] = []
        values, run = [], []
        for f in schema["fields"]:
            var, avro = self.fresh("v"), f["name"]
            if binding is None:
                enc.append(f"    {var} = r[{avro!r}]")
                values.append(f"{avro!r}: {var}")
            elif avro in binding.constants:
                self.scope[f"_k{var}"] = binding.constants[avro]
                enc.append(f"    {var} = _k{var}")
            else:
                attr, to_avro, from_avro = binding.fields[avro]
                self.scope[f"_t{var}"], self.scope[f"_f{var}"] = to_avro, from_avro
                enc.append(f"    {var} = " + (f"_t{var}(r.{attr})" if to_avro else f"r.{attr}"))
                values.append(f"{attr!r}: " + (f"_f{var}({var})" if from_avro else var))
            if self.resolve(f["type"]) == "string":
                run.append(var)
            else:
                enc += self.string_run(run) + self.encode(f["type"], var, "    ")
                run = []
            dec += self.decode(f["type"], var, "    ")
            if binding is not None and avro in binding.constants:
                dec.append(f"    if {var} != _k{var}: raise _F")
        return enc + self.string_run(run), dec, ", ".join(values)

    def string_run(self, run: list[str]) -> list[str]:
        """Consecutive string fields (most of an envelope), when all are ASCII and shorter than 64: one
        joined `str` (each length prefix is then one ASCII character) and one `encode()`; else field by field.
        `join` refuses any value that is not a `str`, as the field-by-field path does."""
        if len(run) < 2:
            return [line for var in run for line in self.encode("string", var, "    ")]
        joined = self.fresh("j")
        items = ", ".join(f"_C[len({var})], {var}" for var in run)
        return [f"    try: {joined} = ''.join(({items}))", f"    except (TypeError, IndexError): {joined} = '\\x80'",
                f"    if {joined}.isascii(): a({joined}.encode())", "    else:",
                *(line for var in run for line in self.encode("string", var, "        "))]

    def encode(self, schema: Any, v: str, ind: str) -> list[str]:
        """Statements appending the encoding of the value in variable `v` to the chunk list's append `a`."""
        s = self.resolve(schema)
        if s == "null":
            return [f"{ind}if {v} is not None: raise _F"]
        if s == "boolean":
            return [f"{ind}if {v} is True: a(b'\\x01')", f"{ind}elif {v} is False: a(b'\\x00')", f"{ind}else: raise _F"]
        if s in ("int", "long"):
            lo, hi = ("_IMIN", "_IMAX") if s == "int" else ("_LMIN", "_LMAX")
            return [f"{ind}if type({v}) is not int or not {lo} <= {v} <= {hi}: raise _F",
                    f"{ind}{v} = ({v} << 1) ^ ({v} >> 63)", f"{ind}a(_SMALL[{v}] if {v} < 128 else _varint({v}))"]
        if s in ("float", "double"):
            return [f"{ind}if type({v}) is not float: raise _F", f"{ind}a(_p{s[0]}({v}))"]
        if s == "bytes":
            n = self.fresh("n")
            return [f"{ind}if type({v}) is not bytes: raise _F", f"{ind}{n} = len({v})",
                    f"{ind}a(_LEN[{n}] if {n} < 64 else _varint({n} << 1))", f"{ind}a({v})"]
        if s == "string":  # short strings: one chunk, length and text
            raw, n = self.fresh("s"), self.fresh("n")
            return [f"{ind}if type({v}) is not str: raise _F", f"{ind}{raw} = {v}.encode()", f"{ind}{n} = len({raw})",
                    f"{ind}a(_LEN[{n}] + {raw} if {n} < 64 else _varint({n} << 1) + {raw})"]
        if isinstance(s, list):
            return self._encode_union(s, v, ind)
        kind = s.get("type")
        if kind == "record":
            return [f"{ind}_e{self.record_function(s, self.bound.get(s['name'].rsplit('.', 1)[-1]))}({v}, a)"]
        if kind == "enum":
            self.named[s["name"]] = s
            table = self.fresh("_enum")
            self.scope[table] = {sym: _varint(i << 1) for i, sym in enumerate(s["symbols"])}
            return [f"{ind}if type({v}) is not str: raise _F", f"{ind}a({table}[{v}])"]
        if kind in ("array", "map"):
            item, key = self.fresh("i"), self.fresh("k")
            body = self.encode(s["items"] if kind == "array" else s["values"], item, ind + "        ")
            loop = f"for {item} in {v}:" if kind == "array" else f"for {key}, {item} in {v}.items():"
            keys = [] if kind == "array" else self.encode("string", key, ind + "        ")
            check = f"type({v}) is not list and type({v}) is not tuple" if kind == "array" else f"type({v}) is not dict"
            return [f"{ind}if {check}: raise _F",
                    f"{ind}if {v}:", f"{ind}    a(_varint(len({v}) << 1))", f"{ind}    {loop}", *keys, *body,
                    f"{ind}a(b'\\x00')"]
        raise _NotCompiled(f"type {kind!r}")

    def _encode_union(self, branches: list[Any], v: str, ind: str) -> list[str]:
        if len(branches) != 2 or branches[0] != "null":
            raise _NotCompiled("unions other than [null, X]")
        return [f"{ind}if {v} is None: a(b'\\x00')", f"{ind}else:", f"{ind}    a(b'\\x02')",
                *self.encode(branches[1], v, ind + "    ")]

    def decode(self, schema: Any, v: str, ind: str) -> list[str]:
        """Statements reading one value of `schema` from `d` at `p` into variable `v`, advancing `p`."""
        s = self.resolve(schema)
        if s == "null":
            return [f"{ind}{v} = None"]
        if s == "boolean":
            return [f"{ind}{v} = d[p]", f"{ind}if {v} > 1: raise _F", f"{ind}{v} = {v} == 1", f"{ind}p += 1"]
        if s in ("int", "long"):
            return [f"{ind}{v} = d[p]", f"{ind}if {v} < 128: {v} = ({v} >> 1) ^ -({v} & 1); p += 1",
                    f"{ind}else: {v}, p = _read_long(d, p)"]
        if s in ("float", "double"):
            return [f"{ind}{v} = _u{s[0]}(d, p)[0]", f"{ind}p += {4 if s == 'float' else 8}"]
        if s in ("bytes", "string"):  # a body cut short ends past len(d): decode() refuses it at the end
            n = self.fresh("n")
            value = f"d[p:(p := p + {n})]" + (".decode()" if s == "string" else "")
            return [f"{ind}{n} = d[p]", f"{ind}if {n} < 128 and not {n} & 1: {n} >>= 1; p += 1",
                    f"{ind}elif {n} & 0x81 == 0x80 and d[p + 1] < 128:",
                    f"{ind}    {n} = (({n} & 0x7F) | (d[p + 1] << 7)) >> 1; p += 2",
                    f"{ind}else: {n}, p = _read_length(d, p)", f"{ind}{v} = {value}"]
        if isinstance(s, list):
            if len(s) != 2 or s[0] != "null":
                raise _NotCompiled("unions other than [null, X]")
            return [f"{ind}{v} = d[p]", f"{ind}p += 1", f"{ind}if {v} == 0: {v} = None", f"{ind}elif {v} == 2:",
                    *self.decode(s[1], v, ind + "    "), f"{ind}else: raise _F"]
        kind = s.get("type")
        if kind == "record":
            return [f"{ind}{v}, p = _d{self.record_function(s, self.bound.get(s['name'].rsplit('.', 1)[-1]))}(d, p)"]
        if kind == "enum":
            symbols = self.fresh("_symbols")
            self.scope[symbols] = tuple(s["symbols"])
            return [*self.decode("long", v, ind), f"{ind}if {v} < 0: raise _F", f"{ind}{v} = {symbols}[{v}]"]
        if kind in ("array", "map"):
            return self._decode_blocks(s, kind, v, ind)
        raise _NotCompiled(f"type {kind!r}")

    def _decode_blocks(self, s: dict[str, Any], kind: str, v: str, ind: str) -> list[str]:
        count, item, key, skip = self.fresh("c"), self.fresh("i"), self.fresh("k"), self.fresh("b")
        inner = ind + "        "
        if kind == "array":
            body = [*self.decode(s["items"], item, inner), f"{inner}{v}.append({item})"]
        else:
            body = [*self.decode("string", key, inner), *self.decode(s["values"], item, inner),
                    f"{inner}{v}[{key}] = {item}"]
        return [f"{ind}{v} = {'[]' if kind == 'array' else '{}'}", *self.decode("long", count, ind),
                f"{ind}while {count}:", f"{ind}    if {count} < 0:", f"{ind}        {count} = -{count}",
                *self.decode("long", skip, ind + "        "), f"{ind}    for _ in range({count}):", *body,
                *self.decode("long", count, ind + "    ")]


def compile_codec(parsed: dict[str, Any], binding: Binding | None = None) -> tuple[Encoder, Decoder] | None:
    """(encode, decode) of a parsed record schema (fastavro's `parse_schema` output), or None where the
    schema uses what is not compiled here or `binding` does not cover its fields. `encode(record, head)`
    returns `head` followed by the Avro body; `decode(data, start)` reads the body from `start` to the end
    of `data` (`bytes`) with this same schema as writer and reader. With a binding, the record is an
    object of the bound class. Both raise `Fallback` for what fastavro must handle."""
    compiler = _Compiler()
    compiler.bound = binding.all_bound() if binding is not None else {}
    try:
        root = compiler.record_function(parsed, binding)
    except _NotCompiled:
        return None
    source = "\n".join([
        *compiler.functions.values(),
        "def encode(r, head=b''):", "    out = [head]", "    try:", f"        _e{root}(r, out.append)",
        "    except (KeyError, AttributeError, ValueError, OverflowError, TypeError) as e: raise _F from e",
        "    return b''.join(out)",
        "def decode(d, p=0):", "    try:", f"        r, p = _d{root}(d, p)",
        "    except (IndexError, ValueError, TypeError, struct_error) as e: raise _F from e",
        "    if p != len(d): raise _F", "    return r"])
    scope = {**compiler.scope, "struct_error": struct.error}
    exec(compile(source, f"<avro codec of {parsed['name']}>", "exec"), scope)
    return scope["encode"], scope["decode"]

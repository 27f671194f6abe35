"""The byte-level pieces of git's patch format that lines of text cannot carry.

``sandbox.patch`` writes and reads diffs in the format of ``git diff --binary``; this module holds
the parts of that format below the level of a text line:

- **path names**: git writes a name that holds a control character, ``"``, ``\\``, DEL or any byte
  above 0x7f as a C-style quoted string (``"a/t\\tab\\303\\251"``: the prefix inside the quotes,
  ``\\a \\b \\t \\n \\v \\f \\r \\" \\\\`` and three-digit octal for the other bytes), the default
  ``core.quotePath = true``. Names are bytes on the file system; Python holds them as ``str`` with
  undecodable bytes as lone surrogates (``surrogateescape``), so every name survives
  ``quote_path``/``unquote_path`` byte for byte and a quoted name is pure ASCII.
- **blob ids**: ``git apply`` refuses a binary hunk unless the ``index`` line carries the full
  SHA-1 of both sides (``blob_id``); the applier checks them too.
- **binary hunks**: ``GIT binary patch`` then ``literal N`` (the new contents) or ``delta N`` (a git
  delta against the old contents), N the inflated size, then the zlib-deflated data in base85
  lines, each led by its byte count (``A``-``Z`` = 1-26, ``a``-``z`` = 27-52), then an empty line. A
  second hunk of the same form, the reverse, may follow. Python's ``base64.b85encode`` uses git's
  alphabet (RFC 1924) and pads the last group with zero bytes as git does.

Errors are ``ValueError`` naming what was malformed; ``sandbox.patch`` adds the file name.
"""

from __future__ import annotations

import base64
import hashlib
import zlib

NULL_ID = "0" * 40
BINARY_LINE_BYTES = 52  # git's most bytes per base85 line
_ESCAPES = {7: "a", 8: "b", 9: "t", 10: "n", 11: "v", 12: "f", 13: "r", 34: '"', 92: "\\"}
_UNESCAPES = {letter: code for code, letter in _ESCAPES.items()}


def to_bytes(text: str) -> bytes:
    """``text`` as the bytes it stands for: UTF-8, lone surrogates back to the bytes they escape."""
    return text.encode("utf-8", "surrogateescape")


def from_bytes(data: bytes) -> str:
    """The inverse of ``to_bytes``: any bytes, undecodable ones as lone surrogates."""
    return data.decode("utf-8", "surrogateescape")


def quote_path(name: str, force: bool = False) -> str:
    """``name`` as git writes it in a patch: unchanged, or C-quoted when any byte needs it (or
    ``force``)."""
    raw = to_bytes(name)
    if not force and not any(b < 0x20 or b >= 0x7F or b in (0x22, 0x5C) for b in raw):
        return name
    out = ['"']
    for b in raw:
        if b in _ESCAPES:
            out.append("\\" + _ESCAPES[b])
        elif b < 0x20 or b >= 0x7F:
            out.append(f"\\{b:03o}")
        else:
            out.append(chr(b))
    out.append('"')
    return "".join(out)


def unquote_path(text: str) -> tuple[str, str]:
    """Read the C-quoted name that ``text`` starts with; returns (name, the text after it)."""
    if not text.startswith('"'):
        raise ValueError(f"{text!r} is not a quoted name")
    raw = bytearray()
    i = 1
    while i < len(text):
        char = text[i]
        if char == '"':
            return from_bytes(bytes(raw)), text[i + 1 :]
        if char != "\\":
            raw += to_bytes(char)
            i += 1
            continue
        escape = text[i + 1 : i + 2]
        if escape in _UNESCAPES:
            raw.append(_UNESCAPES[escape])
            i += 2
        elif len(text[i + 1 : i + 4]) == 3 and all(c in "01234567" for c in text[i + 1 : i + 4]):
            raw.append(int(text[i + 1 : i + 4], 8) & 0xFF)
            i += 4
        else:
            raise ValueError(f"bad escape {text[i:i + 4]!r} in the quoted name {text!r}")
    raise ValueError(f"the quoted name {text!r} has no closing quote")


def blob_id(data: bytes) -> str:
    """The id git gives ``data`` as a blob (SHA-1 of ``blob <size>\\0`` and the bytes)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def encode_literal(data: bytes) -> str:
    """A ``literal`` binary hunk holding ``data``, ending with its empty line."""
    deflated = zlib.compress(data, 9)
    lines = [f"literal {len(data)}\n"]
    for start in range(0, len(deflated), BINARY_LINE_BYTES):
        chunk = deflated[start : start + BINARY_LINE_BYTES]
        count = chr(ord("A") + len(chunk) - 1) if len(chunk) <= 26 else chr(ord("a") + len(chunk) - 27)
        lines.append(count + base64.b85encode(chunk, pad=True).decode("ascii") + "\n")
    return "".join(lines) + "\n"


def decode_hunk_data(size: int, lines: list[str]) -> bytes:
    """The inflated bytes of a binary hunk's base85 ``lines`` (without newlines); ``size`` checks them."""
    deflated = bytearray()
    for line in lines:
        count_char = line[:1]
        if "A" <= count_char <= "Z":
            count = ord(count_char) - ord("A") + 1
        elif "a" <= count_char <= "z":
            count = ord(count_char) - ord("a") + 27
        else:
            raise ValueError(f"binary hunk line {line[:20]!r} does not start with a byte count (A-Z, a-z)")
        encoded = line[1:]
        if len(encoded) != (count + 3) // 4 * 5:
            raise ValueError(f"binary hunk line {line[:20]!r}...: {len(encoded)} base85 characters for {count} bytes")
        try:
            deflated += base64.b85decode(encoded)[:count]
        except ValueError as e:
            raise ValueError(f"binary hunk line {line[:20]!r}...: {e}") from None
    try:
        data = zlib.decompress(bytes(deflated))
    except zlib.error as e:
        raise ValueError(f"binary hunk data does not inflate: {e}") from None
    if len(data) != size:
        raise ValueError(f"binary hunk inflates to {len(data)} bytes, its header says {size}")
    return data


def apply_delta(base: bytes, delta: bytes) -> bytes:
    """Apply a git delta (two varint sizes, then copy-from-base and insert opcodes) to ``base``."""
    pos = 0

    def varint() -> int:
        nonlocal pos
        value = shift = 0
        while True:
            if pos >= len(delta):
                raise ValueError("the delta ends inside its header")
            byte = delta[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    if varint() != len(base):
        raise ValueError(f"the delta is for a {len(base)}-byte preimage of another size")
    size = varint()
    out = bytearray()
    while pos < len(delta):
        op = delta[pos]
        pos += 1
        if op & 0x80:  # copy: offset and size bytes present as the low seven bits flag them
            fields = [0, 0]
            for bit in range(7):
                if op & (1 << bit):
                    if pos >= len(delta):
                        raise ValueError("the delta ends inside a copy")
                    field, shift = (0, bit) if bit < 4 else (1, bit - 4)
                    fields[field] |= delta[pos] << (8 * shift)
                    pos += 1
            offset, length = fields[0], fields[1] or 0x10000
            if offset + length > len(base):
                raise ValueError(f"the delta copies bytes {offset}..{offset + length} of a {len(base)}-byte preimage")
            out += base[offset : offset + length]
        elif op:
            if pos + op > len(delta):
                raise ValueError("the delta ends inside an insert")
            out += delta[pos : pos + op]
            pos += op
        else:
            raise ValueError("the delta holds the reserved opcode 0")
    if len(out) != size:
        raise ValueError(f"the delta made {len(out)} bytes, its header says {size}")
    return bytes(out)

"""Kafka's `sasl.jaas.config` text: `<LoginModule> <flag> (<option>=<value>)* ;` entries.

Kafka reads the value with java.io.StreamTokenizer (JaasConfig), so the same text must mean the
same thing here: words of letters, digits, `.`, `_`, `-` and `$`; values quoted with `"` or `'`
(backslash escapes, no line breaks) or bare words; `//` and `/* */` comments; a bare number is
not a value. A broker's listener-and-mechanism property holds exactly one login module.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CONTROL_FLAGS = ("REQUIRED", "REQUISITE", "SUFFICIENT", "OPTIONAL")

_WORD, _NUMBER, _QUOTED = "word", "number", "quoted"
_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


@dataclass(frozen=True)
class JaasEntry:
    login_module: str
    control_flag: str  # upper case, one of CONTROL_FLAGS
    # Values may be passwords: never shown by repr.
    options: dict[str, str] = field(default_factory=dict, repr=False)


def _is_word_start(c: str) -> bool:
    return c.isascii() and (c.isalpha() or c in "_$") or (not c.isascii() and ord(c) >= 0xA0)


def _is_word_part(c: str) -> bool:
    return _is_word_start(c) or c.isdigit() and c.isascii() or c in ".-"


def _tokens(text: str) -> list[tuple[str, str | None]]:
    """(kind, text) pairs as StreamTokenizer gives them; single characters are their own kind."""
    out: list[tuple[str, str | None]] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if ord(c) <= 32:
            i += 1
        elif c == "/" and text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
        elif c == "/":  # "//" and a lone "/" (StreamTokenizer's comment char) end the line
            while i < n and text[i] not in "\r\n":
                i += 1
        elif c.isdigit() and c.isascii() or c == "." or (
                c == "-" and i + 1 < n and (text[i + 1].isdigit() or text[i + 1] == ".")):
            j, dot = i + 1, c == "."  # digits with at most one dot: a number, not a value
            while j < n and ("0" <= text[j] <= "9" or text[j] == "." and not dot):
                dot = dot or text[j] == "."
                j += 1
            out.append((_NUMBER, None))
            i = j
        elif _is_word_start(c):
            j = i + 1
            while j < n and _is_word_part(text[j]):
                j += 1
            out.append((_WORD, text[i:j]))
            i = j
        elif c in "\"'":
            value, i = _quoted(text, i + 1, c)
            out.append((_QUOTED, value))
        else:
            out.append((c, None))
            i += 1
    return out


def _quoted(text: str, i: int, quote: str) -> tuple[str, int]:
    chars: list[str] = []
    n = len(text)
    while i < n and text[i] != quote and text[i] not in "\r\n":
        c = text[i]
        if c == "\\" and i + 1 < n:
            i += 1
            c = text[i]
            if "0" <= c <= "7":  # up to three octal digits, as StreamTokenizer
                j = i
                limit = i + (3 if c <= "3" else 2)
                while j < n and j < limit and "0" <= text[j] <= "7":
                    j += 1
                chars.append(chr(int(text[i:j], 8)))
                i = j
                continue
            chars.append(_ESCAPES.get(c, c))
        else:
            chars.append(c)
        i += 1
    if i < n and text[i] == quote:
        i += 1
    return "".join(chars), i


def parse_jaas_config(text: str) -> list[JaasEntry]:
    """Every login module entry of ``text``; ValueError with Kafka's message when malformed."""
    tokens = _tokens(text)
    entries: list[JaasEntry] = []
    pos = 0

    def nxt() -> tuple[str, str | None] | None:
        nonlocal pos
        if pos >= len(tokens):
            pos += 1
            return None
        token = tokens[pos]
        pos += 1
        return token

    token = nxt()
    while token is not None:
        login_module = token[1]
        flag = nxt()
        if flag is None:
            raise ValueError("Login module control flag not specified in JAAS config")
        if flag[1] is None:
            raise ValueError("Login module control flag is not available in the JAAS config")
        if flag[1].upper() not in CONTROL_FLAGS:
            raise ValueError(f"Invalid login module control flag '{flag[1]}' in JAAS config")
        options: dict[str, str] = {}
        token = nxt()
        while token is not None and token[0] != ";":
            key = token[1]
            eq, value = nxt(), None
            if eq is not None and eq[0] == "=":
                value = nxt()
            if value is None or value[1] is None or eq is None or eq[0] != "=":
                raise ValueError(f"Value not specified for key '{key}' in JAAS config")
            options[str(key)] = value[1]
            token = nxt()
        if token is None:
            raise ValueError("JAAS config entry not terminated by semi-colon")
        entries.append(JaasEntry(str(login_module), flag[1].upper(), options))
        token = nxt()
    if not entries:
        raise ValueError("Login module not specified in JAAS config")
    return entries


def server_login_module(text: str) -> JaasEntry:
    """The one entry of a broker's `listener.name.<l>.<mechanism>.sasl.jaas.config`."""
    entries = parse_jaas_config(text)
    if len(entries) != 1:
        raise ValueError(f"JAAS config property contains {len(entries)} login modules, "
                         "should be 1 module")
    return entries[0]

"""Schema checks on a decoded request, before any handler sees it.

kafka-python's decoders accept some encodings that Kafka's own generated readers refuse: a
negative length on a string, bytes or array field decodes as None even where the schema says
the field is not nullable, and elements of string arrays can come back None the same way.
Kafka closes the connection on such a request ("non-nullable field ... was serialized as
null"), as on any frame it cannot parse; so does the broker, with the reason logged once, so
handlers may rely on every non-nullable field being there.

The walk runs on every request, so it is planned once per (message class, version): only the
fields whose decoded value can be None although the schema forbids it are visited, and the plan
is compiled into a small straight-line function (as kafka-python compiles its decoders). A
request whose schema has nothing to check costs one dict lookup.

What is deliberately not checked, because the decoder never produces it: fields outside their
versions (only in-version fields are read, tagged ones included), nulls in int, bool or
non-nullable nested struct fields. A zero UUID decodes as None and is legal on the wire (Kafka's
Uuid.ZERO_UUID); what it means is the handler's business. What decoding hides cannot be checked
here: an array count below -1 comes back as [] (Kafka refuses it unless nullable, then null).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Check = Callable[[Any], "str | None"]

# Wire types whose decoder yields None for a negative length.
_DECODES_AS_NONE = frozenset({"string", "bytes", "records"})


def _nothing(_message: Any) -> None:
    return None


# message class -> version -> plan; two lookups on a class and an int, no tuple to hash.
_plans: dict[type, dict[int, Check]] = {}


def schema_violation(message: Any, version: int) -> str | None:
    """The first way `message` breaks its schema at `version`, or None when it keeps to it."""
    try:
        check = _plans[message.__class__][version]
    except KeyError:
        check = _plans.setdefault(message.__class__, {})[version] = plan(message.__class__, version)
    return check(message)


def plan(message_class: type, version: int) -> Check:
    """Compile the checks `message_class` needs at `version` (exposed for tests and benches)."""
    struct = message_class._struct  # type: ignore[attr-defined]
    emitter = _Emitter(version)
    body = emitter.struct(struct.fields.values(), "m", "", 1)
    if not body:
        return _nothing
    source = "\n".join(["def check(m):", *body, "    return None"])
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<schema check {struct.name} v{version}>", "exec"), namespace)
    check: Check = namespace["check"]
    check.__doc__ = source  # what the plan is, for anyone debugging a refusal
    return check


class _Emitter:
    """Writes the Python lines of one plan; an empty list means nothing needs checking."""

    def __init__(self, version: int) -> None:
        self.version = version
        self._n = 0

    def _var(self) -> str:
        self._n += 1
        return f"v{self._n}"

    def struct(self, fields: Any, var: str, path: str, depth: int) -> list[str]:
        lines: list[str] = []
        for field in fields:
            if field.for_version_q(self.version):
                lines += self.field(field, var, path, depth)
        return lines

    def field(self, field: Any, var: str, path: str, depth: int) -> list[str]:
        v = self.version
        pad = "    " * depth
        name = path + field.name
        # A tagged field that is absent reads as its default; where that default is None
        # (tagged structs, nullable strings) None says nothing about the wire.
        may_be_none = field.nullable_for_version_q(v) or (
            field.tagged_field_q(v) and field.default is None)
        value = self._var()
        null_check = [f"{pad}if {value} is None:",
                      f"{pad}    return {f'non-nullable field {name} is null'!r}"]
        if field.is_struct_array():
            item = self._var()
            inner = self.struct(field.fields.values(), item, name + "[].", depth + 1)
            if may_be_none and not inner:
                return []
            lines = [f"{pad}{value} = {var}.{field.name}"]
            if may_be_none:
                lines += [f"{pad}if {value} is not None:",
                          f"{pad}    for {item} in {value}:", *_indent(inner)]
            else:
                lines += null_check
                if inner:
                    lines += [f"{pad}for {item} in {value}:", *inner]
            return lines
        if field.is_array():
            elements_nullable = field.array_of.type_str in _DECODES_AS_NONE
            if may_be_none and not elements_nullable:
                return []
            null_element = f"{pad}    return {f'non-nullable element of {name} is null'!r}"
            lines = [f"{pad}{value} = {var}.{field.name}"]
            if may_be_none:
                return [*lines, f"{pad}if {value} is not None and None in {value}:", null_element]
            lines += null_check
            if elements_nullable:
                lines += [f"{pad}if None in {value}:", null_element]
            return lines
        if field.is_struct():
            # Non-nullable nested structs always decode; only their insides can break.
            inner = self.struct(field.fields.values(), value, name + ".", depth + 1)
            if not inner:
                return []
            return [f"{pad}{value} = {var}.{field.name}", f"{pad}if {value} is not None:",
                    *inner]
        if field.type_str in _DECODES_AS_NONE and not may_be_none:
            return [f"{pad}{value} = {var}.{field.name}", *null_check]
        return []


def _indent(lines: list[str]) -> list[str]:
    return ["    " + line for line in lines]

"""OTLP/HTTP JSON: request bodies read into the official messages, responses written back as JSON.

The OTLP specification's "JSON Protobuf Encoding" is protobuf's canonical JSON mapping, read here with
``google.protobuf.json_format.ParseDict``: lowerCamelCase or the original snake_case field names, enum
values as integers or names, 64-bit integers as decimal strings or numbers, unknown fields ignored. OTLP
makes one exception to the mapping: trace and span ids (``traceId``, ``spanId``, ``parentSpanId`` of
spans, links, log records and exemplars) are case-insensitive hex strings, not base64. json_format has
no hook for that, so the one hand-written part (``_hex_ids``) rewrites those fields from hex to base64
before ``ParseDict`` reads them; it is guided by the messages' descriptors and descends only into
fields whose message type can hold an id (never into attributes or values). Hex that is not hex (odd
length, other characters, not a string) is refused; well-formed hex of the wrong length is read as
such and handled like the same id in a protobuf request (the span or log record is dropped and
reported as partial success, ``ids.py``).

Bounds, beside those every request has (body size, gzip, the byte budget at admission):

- nesting: orjson refuses JSON nested past 1024 levels before anything deeper is built, and
  ``ParseDict`` refuses messages nested past ``MAX_MESSAGE_DEPTH`` (100, the limit upb's binary decoder
  applies to a protobuf request), so a JSON request nests no deeper than a protobuf one may;
- memory: the parsed JSON tree is Python objects, 8 to 13 times the body's bytes and 10 to 17 at the
  peak of parsing (process RSS, measured on SDK-shaped spans, on attributes of one boolean each and
  on an array of small integers), against about 1 for a parsed protobuf; the receiver holds
  ``JSON_PARSE_FACTOR`` times the body in the byte budget while the body is parsed (``otlp.py``).

Parsing JSON costs far more CPU than protobuf (``ParseDict`` is pure Python: about 0.4 s per MB of
JSON spans, against under 10 ms for the same spans in protobuf); OTLP SDKs send protobuf unless
told otherwise.
"""

from __future__ import annotations

import base64
import binascii
import functools
import re
from typing import Any, Final

import orjson
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

CONTENT_TYPE: Final = "application/json"
MAX_MESSAGE_DEPTH: Final = 100  # upb's default decoding depth limit for binary protobuf
JSON_PARSE_FACTOR: Final = 20  # bytes held while a JSON body is parsed, per byte of it (17 measured at most)
MAX_REASON: Final = 512  # characters of a parser's message quoted in the answer
_ENCLOSING: Final = re.compile(r"^(?:Failed to parse \w+ field: )+(?=Failed to parse \w+ field: )")
_ID_FIELDS: Final = frozenset({"trace_id", "span_id", "parent_span_id"})


class JsonRequestError(ValueError):
    """A JSON body that is not an OTLP request; its message says where and why (answered 400)."""


def decode(message_type: type[Message], body: bytes) -> Message:
    """The request a JSON body holds (raises JsonRequestError)."""
    try:
        tree = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise JsonRequestError(f"not JSON: {exc}") from None
    if not isinstance(tree, dict):
        raise JsonRequestError(f"not an OTLP request: a JSON object is expected, not {type(tree).__name__}")
    _hex_ids(tree, message_type.DESCRIPTOR, "", 0)
    message = message_type()
    try:
        json_format.ParseDict(tree, message, ignore_unknown_fields=True, max_recursion_depth=MAX_MESSAGE_DEPTH)
    except Exception as exc:  # ParseError mostly; json_format.Parse turns any other into one the same way
        raise JsonRequestError(f"not an OTLP request: {_reason(exc)}") from None
    return message


def _reason(exc: Exception) -> str:
    """ParseDict's message, of its "Failed to parse F field: " (once per enclosing field) the innermost only."""
    return _ENCLOSING.sub("", str(exc)).rstrip(".")[:MAX_REASON]


def encode(message: Message) -> bytes:
    """A response (or a ``google.rpc.Status``) as OTLP JSON: lowerCamelCase names, 64-bit integers as strings."""
    return orjson.dumps(json_format.MessageToDict(message))


def _hex_ids(node: Any, descriptor: Descriptor, path: str, depth: int) -> None:
    """Rewrite the hex ids under ``node`` (a parsed JSON object of ``descriptor``'s type) to base64, in place."""
    if not isinstance(node, dict) or depth > MAX_MESSAGE_DEPTH:
        return  # a wrong type is ParseDict's to report, too deep too
    ids, children = _plan(descriptor)
    for key, value in node.items():
        if key in ids:
            node[key] = _base64(value, f"{path}{key}")
        elif key in children:
            items = value if isinstance(value, list) else [value]
            for i, item in enumerate(items):
                where = f"{path}{key}[{i}]." if isinstance(value, list) else f"{path}{key}."
                _hex_ids(item, children[key], where, depth + 1)


def _base64(value: object, where: str) -> object:
    if value is None:
        return None  # null: the field's default, as ParseDict reads it
    if not isinstance(value, str):
        raise JsonRequestError(f"{where}: a hex string is expected")
    try:
        raw = binascii.a2b_hex(value)
    except (binascii.Error, ValueError):
        raise JsonRequestError(f"{where}: not a hex string: {value[:64]!r}") from None
    return base64.b64encode(raw).decode("ascii")


@functools.cache
def _plan(descriptor: Descriptor) -> tuple[frozenset[str], dict[str, Descriptor]]:
    """The JSON keys (both spellings) of a message's id fields, and of its message fields that can hold ids."""
    ids: set[str] = set()
    children: dict[str, Descriptor] = {}
    for field in descriptor.fields:
        keys = (field.json_name, field.name)
        if field.name in _ID_FIELDS and field.type == FieldDescriptor.TYPE_BYTES:
            ids.update(keys)
        elif field.message_type is not None and _holds_ids(field.message_type, frozenset()):
            children.update(dict.fromkeys(keys, field.message_type))
    return frozenset(ids), children


def _holds_ids(descriptor: Descriptor, seen: frozenset[str]) -> bool:
    if descriptor.full_name in seen:
        return False
    seen |= {descriptor.full_name}
    return any(
        (field.name in _ID_FIELDS and field.type == FieldDescriptor.TYPE_BYTES)
        or (field.message_type is not None and _holds_ids(field.message_type, seen))
        for field in descriptor.fields
    )

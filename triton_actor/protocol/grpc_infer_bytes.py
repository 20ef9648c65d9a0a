"""A ``ModelInferRequest``'s bytes without its request id, read without decoding the message (sans-I/O).

The response cache's gRPC fast path (``frontends/cached_answers.py``) names a request by its bytes, as the
HTTP one names a body: two messages whose bytes are the same decode to the same request. A client's
requests differ in their id (field 3) even when everything the cache's key reads is the same (the model's
name and version, the inputs' names, shapes, types and bytes, the parameters), so the id is cut out of the
bytes and given back beside them; the answer gets it put back in (Triton answers with the request's id).

Only the top level is read: every field of ``ModelInferRequest`` (model_name 1, model_version 2, id 3,
parameters 4, inputs 5, outputs 6, raw_input_contents 7) is length-delimited, so the scan is a tag byte and
a length per field. Anything else (another wire type, a field number past 15, a truncated length, the
name, version or id given twice, which protobuf reads as the last one) answers None: the request is then
decoded the regular way, which says what is wrong with it, if anything.
"""

from __future__ import annotations

_LEN = 2  # protobuf's wire type of a length-delimited field


def split_id(data: bytes) -> tuple[bytes, bytes, bytes, bytes] | None:
    """``(the message without its id field, model_name, model_version, id)``, the last three as the
    message's raw UTF-8 bytes (empty when absent); None when the message is not read here."""
    n = len(data)
    i = start = 0
    name = version = rid = None
    pieces = []
    while i < n:
        tag = data[i]
        if tag & 7 != _LEN or tag >= 0x80:
            return None
        j, length, shift = i + 1, 0, 0
        while True:  # the length, a varint
            if j >= n or shift > 28:
                return None
            b = data[j]
            j += 1
            length |= (b & 0x7F) << shift
            if b < 0x80:
                break
            shift += 7
        end = j + length
        if end > n:
            return None
        field = tag >> 3
        if field == 1:
            if name is not None:
                return None
            name = data[j:end]
        elif field == 2:
            if version is not None:
                return None
            version = data[j:end]
        elif field == 3:
            if rid is not None:
                return None
            rid = data[j:end]
            pieces.append(data[start:i])
            start = end
        i = end
    if rid is None:
        return data, name or b"", version or b"", b""
    pieces.append(data[start:])
    return b"".join(pieces), name or b"", version or b"", rid


_HEAD_TAGS = (0x0A, 0x12, 0x1A)  # fields 1, 2, 3 (model_name, model_version, id), length-delimited


def split_head(data: bytes) -> tuple[bytes, bytes, bytes, bytes] | None:
    """:func:`split_id`'s answer read from the leading fields alone, for a message a cache looks up by
    what :func:`split_id` gave before: the name, version and id, in any order, up to the first other
    field (where every serializer puts them: fields in number order), each with a one-byte length.

    Only the head is read (a few bytecodes against a walk over every input), so the answer is not
    checked: a later name, version or id stays in the bytes given back. Such bytes are never among what
    :func:`split_id` gave (it reads every field and refuses those), so a lookup of them finds nothing;
    when it finds something, the message is that one with this id put in at a field boundary, and the
    name (and the version, if the head has one) are the message's only ones. None: a length past
    127 bytes in the head, or a truncated field."""
    n = len(data)
    i = 0
    name = version = rid = b""
    cut = None
    while i + 1 < n:
        tag = data[i]
        if tag not in _HEAD_TAGS:
            break
        length = data[i + 1]
        end = i + 2 + length
        if length >= 0x80 or end > n:
            return None
        if tag == 0x0A:
            name = data[i + 2:end]
        elif tag == 0x12:
            version = data[i + 2:end]
        else:
            rid, cut = data[i + 2:end], (i, end)
        i = end
    if cut is None:
        return data, name, version, rid
    return data[:cut[0]] + data[cut[1]:], name, version, rid

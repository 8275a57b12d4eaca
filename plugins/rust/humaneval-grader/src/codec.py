# Values crossing between the candidate's interpreter and the judge's, as JSON. Only exact
# builtin types are encoded (a subclass could lie in __eq__); sets are sorted by their
# encoding so that equal sets have equal keys whatever the hash seed.
import json as _wirl_json


class _WirlUnencodable(Exception):
    pass


def _wirl_enc(v, depth=0):
    if depth > 100:
        raise _WirlUnencodable("nested more than 100 deep")
    t = type(v)
    if v is None or t is bool or t is str:
        return v
    if t is int:
        return {"i": str(v)}
    if t is float:
        return {"f": repr(v)}
    if t is complex:
        return {"c": [repr(v.real), repr(v.imag)]}
    if t is bytes:
        return {"b": v.hex()}
    if t is list:
        return {"l": [_wirl_enc(x, depth + 1) for x in v]}
    if t is tuple:
        return {"t": [_wirl_enc(x, depth + 1) for x in v]}
    if t is dict:
        return {"d": [[_wirl_enc(k, depth + 1), _wirl_enc(x, depth + 1)] for k, x in v.items()]}
    if t is set or t is frozenset:
        items = sorted((_wirl_enc(x, depth + 1) for x in v), key=lambda e: _wirl_json.dumps(e, sort_keys=True))
        return {"s" if t is set else "fs": items}
    raise _WirlUnencodable(f"a value of type {t.__name__}")


def _wirl_dec(e):
    if e is None or type(e) in (bool, str):
        return e
    if type(e) is not dict or len(e) != 1:
        raise ValueError("malformed value")
    (tag, x), = e.items()
    if tag == "i":
        return int(x)
    if tag == "f":
        return float(x)
    if tag == "c":
        return complex(float(x[0]), float(x[1]))
    if tag == "b":
        return bytes.fromhex(x)
    if tag == "l":
        return [_wirl_dec(y) for y in x]
    if tag == "t":
        return tuple(_wirl_dec(y) for y in x)
    if tag == "d":
        return {_wirl_dec(k): _wirl_dec(y) for k, y in x}
    if tag == "s":
        return {_wirl_dec(y) for y in x}
    if tag == "fs":
        return frozenset(_wirl_dec(y) for y in x)
    raise ValueError(f"unknown tag {tag!r}")


def _wirl_key(args, kwargs):
    return _wirl_json.dumps(_wirl_enc([list(args), sorted(kwargs.items())]), sort_keys=True)

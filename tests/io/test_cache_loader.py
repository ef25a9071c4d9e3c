"""histocal.cache's loader on bad files (docs/ort_parity.md, *Calibration cache*): ORT's error texts
where ORT has them, ValueError naming the file for everything else; malformed, oversized, deeply
nested and wrongly typed files only ever raise ValueError, and every successful load equals ORT's
own (fuzzed). Writing, reading and atomicity are in test_cache.py.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnxruntime.quantization import calibrate as ort
from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData
from support.caches import assert_same, ort_load
from support.profiles import examples

from histocal.io import cache

FLOAT_DTYPES = [np.float16, np.float32]


# ----------------------------------------------------------------------------------------------
# Loader errors: ORT's texts where ORT has them, ValueError naming the file for everything else
# ----------------------------------------------------------------------------------------------


@pytest.mark.parity
def test_missing_and_directory_like_ort(tmp_path):
    missing = tmp_path / "nope.json"
    for loader in (cache.load_tensors_data, ort.load_tensors_data):
        with pytest.raises(FileNotFoundError, match=f"^{re.escape(f'Calibration cache not found: {missing}')}$"):
            loader(missing)
        with pytest.raises(ValueError, match=f"^{re.escape(f'Calibration cache path is not a file: {tmp_path}')}$"):
            loader(tmp_path)


VALID = {
    "CLS": "TensorsData",
    "data": {
        "t": {
            "lowest": 1.5,
            "highest": {"data": [2.0, 3.0], "dtype": "float32", "CLS": "numpy.array"},
            "hist": 4,
            "bins": {"data": [1, 2], "dtype": "int64", "CLS": "numpy.array"},
            "CLS": "TensorData",
        }
    },
    "calibration_method": {"CLS": "CalibrationMethod", "value": "CalibrationMethod.Percentile"},
    "smooth_quant": False,
}


def variant(*path, value=None, delete: bool = False) -> dict:
    """VALID with the value at ``path`` replaced (or deleted)."""
    doc = json.loads(json.dumps(VALID))
    node = doc
    for key in path[:-1]:
        node = node[key]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


def in_tensor(key: str, value) -> dict:
    return variant("data", "t", key, value=value)


ORT_ERRORS = {  # same text as ORT's ValueError
    "unknown key": in_tensor("foo", 1),
    "list value": in_tensor("lowest", [1.0]),
    "float64 value": in_tensor("lowest", {"data": 1.0, "dtype": "float64", "CLS": "numpy.array"}),
    "string value": in_tensor("lowest", "1.0"),
    "null value": in_tensor("avg", None),
}


@pytest.mark.parity
@pytest.mark.parametrize("name", ORT_ERRORS)
def test_value_errors_with_ort_text(tmp_path, name):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(ORT_ERRORS[name]))
    with pytest.raises(ValueError) as theirs:
        ort_load(path)
    with pytest.raises(ValueError) as ours:
        cache.load_tensors_data(path)
    assert str(ours.value) == f"Invalid calibration cache {path}: {theirs.value}"


def arr(data, dtype="float32"):
    return {"data": data, "dtype": dtype, "CLS": "numpy.array"}


BAD_DOCUMENTS = {
    # structure
    "top-level list": [VALID],
    "top-level null": None,
    "no data": variant("data", delete=True),
    "no method": variant("calibration_method", delete=True),
    "data is list": variant("data", value=[]),
    "entry is list": variant("data", "t", value=[]),
    "key self": in_tensor("self", 1),  # would be a TypeError in ORT's TensorData(**kwargs)
    "unknown method": variant(
        "calibration_method", value={"CLS": "CalibrationMethod", "value": "CalibrationMethod.Foo"}
    ),
    "method value int": variant("calibration_method", value={"CLS": "CalibrationMethod", "value": 2}),
    "array without dtype": in_tensor("highest", {"data": [1.0], "CLS": "numpy.array"}),
    "array without data": in_tensor("highest", {"dtype": "float32", "CLS": "numpy.array"}),
    # wrong types and values
    "bool as float": in_tensor("lowest", True),
    "float hist": in_tensor("hist", 1.5),
    "nan hist": in_tensor("hist", float("nan")),
    "inf bins": in_tensor("bins", float("inf")),
    "list hist": in_tensor("hist", [1, 2]),
    "string hist": in_tensor("hist", "1"),
    "hist beyond int64": in_tensor("hist", 2**63),
    "float out of f32 range": in_tensor("lowest", 1e39),
    "huge int as float": in_tensor("lowest", 10**80),
    "f16 overflow": in_tensor("highest", arr([70000.0], "float16")),
    "strings in array": in_tensor("highest", arr(["1.5"])),
    "null in array": in_tensor("highest", arr([None])),
    "bool in array": in_tensor("highest", arr([True])),
    "dict in array": in_tensor("highest", arr([{}])),
    "ragged": in_tensor("highest", arr([[1.0], [1.0, 2.0]])),
    "ragged empty": in_tensor("bins", arr([[], [1]], "int64")),
    "float in int array": in_tensor("bins", arr([1.5], "int64")),
    "nan in int array": in_tensor("bins", arr([float("nan")], "int64")),
    "int64 overflow": in_tensor("bins", arr([2**63], "int64")),
    "uint8 overflow": in_tensor("bins", arr([256], "uint8")),
    "negative uint": in_tensor("bins", arr([-1], "uint64")),
    # dtypes numpy accepts but ORT never writes
    **{
        f"dtype {d!r}": in_tensor("bins", arr([1], d))
        for d in [
            "object",
            "O",
            "V8",
            "(1000000000,)float32",
            "(100000,100000)int64",
            "bool",
            "complex64",
            "<U5",
            "M8[s]",
            "<f4",
            "f4",
            "float",
            "S1",
            "",
            5,
            None,
            ["float32"],
        ]
    },
}


@pytest.mark.parametrize("name", BAD_DOCUMENTS)
def test_bad_documents_raise_value_error(tmp_path, name):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(BAD_DOCUMENTS[name]))
    with pytest.raises(ValueError) as err:
        cache.load_tensors_data(path)
    assert type(err.value) is ValueError and str(path) in str(err.value)


BAD_TEXTS = {
    "empty": b"",
    "truncated": json.dumps(VALID).encode()[:-3],
    "garbage": b"\x00\x01{",
    "not utf-8": json.dumps(VALID).encode().replace(b"Percentile", b"Percentil\xe9"),
    "utf-8 bom": b"\xef\xbb\xbf" + json.dumps(VALID).encode(),
    "trailing data": json.dumps(VALID).encode() + b" []",
    "deep arrays": b'{"data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "deep unclosed": b"[" * 1_000_000,
    "deep objects": b'{"a": ' * 50_000 + b"1" + b"}" * 50_000,
    "deep in array data": json.dumps(in_tensor("highest", arr("SENTINEL")))
    .encode()
    .replace(b'"SENTINEL"', b"[" * 40 + b"1.0" + b"]" * 40),
    "5000-digit int": json.dumps(in_tensor("hist", "SENTINEL")).encode().replace(b'"SENTINEL"', b"9" * 5000),
    "101-digit int": json.dumps(in_tensor("hist", "SENTINEL")).encode().replace(b'"SENTINEL"', b"9" * 101),
    "lowercase nan": json.dumps(VALID).encode().replace(b"1.5", b"nan"),
}


@pytest.mark.parametrize("name", BAD_TEXTS)
def test_bad_texts_raise_value_error(tmp_path, name):
    path = tmp_path / "c.json"
    path.write_bytes(BAD_TEXTS[name])
    with pytest.raises(ValueError) as err:
        cache.load_tensors_data(path)
    assert type(err.value) is ValueError and str(path) in str(err.value)


@pytest.mark.parity
def test_brackets_inside_strings_do_not_count_as_nesting(tmp_path):
    name = "a[" * 200 + '"{\\"' + "}" * 300
    td = TensorsData(CalibrationMethod.MinMax, {name: TensorData(lowest=np.float32(1), highest=np.float32(2))})
    cache.save_tensors_data(td, tmp_path / "c.json")
    assert_same(cache.load_tensors_data(tmp_path / "c.json"), ort_load(tmp_path / "c.json"))


@pytest.mark.parity
def test_nan_and_infinity_tokens_accepted_like_ort(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(in_tensor("highest", arr([float("nan"), float("-inf"), 1e400]))))
    assert b"-Infinity" in path.read_bytes()
    assert_same(cache.load_tensors_data(path), ort_load(path))


def test_oversized_file_rejected_before_reading(tmp_path, monkeypatch):
    path = tmp_path / "big.json"
    with open(path, "wb") as f:  # sparse: no disk space, and reading it would take seconds
        f.truncate(cache.MAX_CACHE_BYTES + 1)
    real_fdopen = os.fdopen

    class NoRead:
        def __init__(self, *args, **kwargs):
            self.file = real_fdopen(*args, **kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def fileno(self):
            return self.file.fileno()

        def read(self, *args):
            raise AssertionError("the file was read")

    with monkeypatch.context() as patch:
        patch.setattr(os, "fdopen", NoRead)
        with pytest.raises(ValueError, match="more than the limit"):
            cache.load_tensors_data(path)
    monkeypatch.setattr(cache, "MAX_CACHE_BYTES", 100)
    path.write_text(json.dumps(VALID))
    with pytest.raises(ValueError, match="more than the limit of 100"):
        cache.load_tensors_data(path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_is_not_a_file(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a file"):
        cache.load_tensors_data(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        cache.read_json_file(fifo)  # opened non-blocking: must not hang


def test_read_json_file(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"a": [1, NaN, {"b": "[[[["}]}')
    doc = cache.read_json_file(path, max_bytes=100, max_depth=3)
    assert doc["a"][0] == 1 and math.isnan(doc["a"][1])
    with pytest.raises(ValueError, match="nested 3 levels"):
        cache.read_json_file(path, max_depth=2)
    with pytest.raises(ValueError, match="limit of 10"):
        cache.read_json_file(path, max_bytes=10)
    with pytest.raises(FileNotFoundError):
        cache.read_json_file(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="Invalid JSON file"):
        cache.read_json_file(tmp_path)


# ----------------------------------------------------------------------------------------------
# Fuzzing the loader: only ValueError or success, and every success equals ORT's own load
# ----------------------------------------------------------------------------------------------
# Hypothesis draws a seed (plus the base document); the mutation is built from random.Random(seed), which keeps
# each example cheap. 10,300 loader inputs in total over the five tests below.


def _base_documents() -> list[bytes]:
    f16, f32 = np.float16, np.float32
    docs = [
        TensorsData(
            CalibrationMethod.MinMax,
            {
                "a": TensorData(lowest=np.array([-1.5, 0.25], f32), highest=np.array([[2.0], [3.0]], f32)),
                "b[0]": TensorData(lowest=np.array([np.inf], f32), highest=np.array([-np.inf], f32)),
            },
        ),
        TensorsData(
            CalibrationMethod.Entropy,
            {
                "e": TensorData(
                    lowest=f16(-1), highest=f16(2), hist=np.array([3, 0, 5]), bins=np.array([-1, 0, 1, 2], f16)
                ),
            },
        ),
        TensorsData(
            CalibrationMethod.Percentile,
            {
                "p": TensorData(lowest=f32(-0.5), highest=np.array(7.25, f32), hist=3, bins=1),
            },
        ),
        TensorsData(
            CalibrationMethod.Distribution,
            {
                "d": TensorData(
                    avg=np.array(0.5, f32),
                    std=np.array(np.nan, f32),
                    hist=np.array([1, 2]),
                    hist_edges=np.array([0, 1, 2], f32),
                    lowest=f32(-np.inf),
                    highest=f32(1e-5),
                ),
            },
        ),
    ]
    return [json.dumps(td.to_dict() | {"smooth_quant": False}, cls=cache._CacheEncoder).encode() for td in docs]


BASE_DOCUMENTS = _base_documents()
BASES = st.integers(0, len(BASE_DOCUMENTS) - 1)
SEEDS = st.integers(0, 2**64 - 1)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, child in node.items():
            yield from _paths(child, (*prefix, key))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            yield from _paths(child, (*prefix, index))


BASE_PATHS = [list(_paths(json.loads(doc))) for doc in BASE_DOCUMENTS]
DTYPE_NAMES = [
    "float16",
    "float32",
    "float64",
    "int64",
    "int32",
    "uint8",
    "uint64",
    "object",
    "V8",
    "(1000000000,)f4",
    "bool",
    "<f4",
    "complex64",
    "U3",
    "M8[s]",
    "",
    "float128",
]
KEYS = [
    "CLS",
    "data",
    "dtype",
    "lowest",
    "highest",
    "hist",
    "bins",
    "avg",
    "std",
    "hist_edges",
    "value",
    "smooth_quant",
    "calibration_method",
    "self",
    "__class__",
    "",
]
STRINGS = (
    KEYS
    + DTYPE_NAMES
    + [
        "numpy.array",
        "CalibrationMethod",
        "CalibrationMethod.MinMax",
        "Entropy",
        "TensorData",
        "1.5",
        "NaN",
        "\u00e9\u4e2d",
        "\ud800",
    ]
)
FLOATS = [
    0.0,
    -0.0,
    1.5,
    -2.25,
    1e-5,
    5e-324,
    1e39,
    -1e39,
    65504.0,
    65520.0,
    3.4028235677973366e38,
    1e308,
    float("nan"),
    float("inf"),
    float("-inf"),
]
INTS = [0, 1, -1, 7, 255, 256, 2**31, 2**53 + 1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 10**30]
RAW_TOKENS = [
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b"1e400",
    b"-1e999999999",
    b"9" * 30,
    b"-" + b"9" * 5000,
    b"1" * 101,
    b"0.1e-400",
    b"4.9e-324",
    b"65520.0",
    b"3.4028235677973366e+38",
    b"18446744073709551616",
    b"-0.0",
    b"1" + b"0" * 4400,
    b"0." + b"1" * 10000,
]


def random_number(rng: random.Random):
    roll = rng.random()
    if roll < 0.3:
        return rng.choice(FLOATS)
    if roll < 0.5:
        return rng.choice(INTS)
    return rng.uniform(-1e6, 1e6) if roll < 0.8 else rng.randint(-1000, 1000)


def random_numbers(rng: random.Random, depth: int = 0):
    """A numeric list, usually rectangular, sometimes ragged or with a stray non-number."""
    if depth > 2 or rng.random() < 0.3:
        return random_number(rng) if rng.random() < 0.95 else random_json(rng, 3)
    width = rng.randint(0, 3)
    return [random_numbers(rng, depth + 1) for _ in range(width)]


def random_json(rng: random.Random, depth: int = 0):
    kinds = ["null", "bool", "number", "number", "string"] + ["list", "dict", "array", "array", "method"] * (depth < 3)
    kind = rng.choice(kinds)
    if kind == "null":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "number":
        return random_number(rng)
    if kind == "string":
        return rng.choice(STRINGS)
    if kind == "list":
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind == "dict":
        return {rng.choice(KEYS): random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    if kind == "array":
        array = {"data": random_numbers(rng), "dtype": rng.choice(DTYPE_NAMES), "CLS": "numpy.array"}
        if rng.random() < 0.1:
            del array[rng.choice(list(array))]
        return array
    return {"CLS": "CalibrationMethod", "value": rng.choice(STRINGS) if rng.random() < 0.9 else random_json(rng, 3)}


def substitute(which: int, seed: int, raw_tokens: bool) -> bytes:
    """The base document with one value replaced (or one key added) somewhere."""
    rng = random.Random(seed)
    doc = json.loads(BASE_DOCUMENTS[which])
    path = rng.choice(BASE_PATHS[which])
    value = "@@RAW@@" if raw_tokens else random_json(rng)
    if not path:
        doc = value
    else:
        node = doc
        for key in path[:-1]:
            node = node[key]
        if isinstance(node, dict) and rng.random() < 0.25:
            node[rng.choice(KEYS)] = value
        else:
            node[path[-1]] = value
    text = json.dumps(doc).encode()
    return text.replace(b'"@@RAW@@"', rng.choice(RAW_TOKENS)) if raw_tokens else text


@pytest.fixture(scope="module")
def fuzz_file(workdir) -> Path:
    return workdir / "fuzz.json"


def load_both(path: Path, raw: bytes) -> None:
    """The fuzz oracle: histocal raises ValueError (never anything else) or returns exactly ORT's result."""
    path.write_bytes(raw)
    try:
        ours = cache.load_tensors_data(path)
    except ValueError as exc:
        assert type(exc) is ValueError and str(path) in str(exc)
        return
    assert_same(ours, ort_load(path))


@pytest.mark.parity
@settings(max_examples=examples(4500))
@given(which=BASES, seed=SEEDS)
def test_fuzz_substituted_values(fuzz_file, which, seed):
    load_both(fuzz_file, substitute(which, seed, raw_tokens=False))


@pytest.mark.parity
@settings(max_examples=examples(800))
@given(which=BASES, seed=SEEDS)
def test_fuzz_huge_numbers(fuzz_file, which, seed):
    load_both(fuzz_file, substitute(which, seed, raw_tokens=True))


@pytest.mark.parity
@settings(max_examples=examples(1500))
@given(which=BASES, cut=st.integers(0, 10**6))
def test_fuzz_truncated(fuzz_file, which, cut):
    doc = BASE_DOCUMENTS[which]
    load_both(fuzz_file, doc[: cut % len(doc)])


@pytest.mark.parity
@settings(max_examples=examples(2500))
@given(which=BASES, seed=SEEDS)
def test_fuzz_byte_edits(fuzz_file, which, seed):
    rng = random.Random(seed)
    raw = bytearray(BASE_DOCUMENTS[which])
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(raw))
        kind = rng.random()
        if kind < 0.5:
            raw[at] = rng.choice(b'[]{}",:\\0123456789.eE-+ aNI\x00\xff') if rng.random() < 0.7 else rng.randrange(256)
        elif kind < 0.75:
            raw[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 3)))
        else:
            del raw[at : at + rng.randint(1, 3)]
    load_both(fuzz_file, bytes(raw))


@pytest.mark.parity
@settings(max_examples=examples(1000))
@given(which=BASES, seed=SEEDS)
def test_fuzz_deep_nesting(fuzz_file, which, seed):
    rng = random.Random(seed)
    doc = BASE_DOCUMENTS[which]
    at = rng.randrange(len(doc) + 1)
    depth = int(10 ** rng.uniform(0, 5))  # 1 .. 100,000, log-uniform
    opener, closer = rng.choice([(b"[", b"]"), (b'{"a": ', b"}"), (b'[{"data": ', b"}]")])
    nest = opener * depth + b"0" + (closer * depth if rng.random() < 0.7 else b"")
    load_both(fuzz_file, doc[:at] + nest + doc[at:])

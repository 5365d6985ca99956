#!/usr/bin/env python3
"""Reads what tests/interop/checkpoint_writer wrote with other people's readers and compares every
value with numpy's own computation of it.

    check_checkpoint.py <out>     # the writer's output directory

<out>/zarr and <out>/zarr-zstd (zstd chunks) are opened with zarr-python (zarr.open_group), <out>/st/model.safetensors and the
files of <out>/st-split (through model.safetensors.index.json) with the safetensors package.
<out>/manifest.json lists each array's name, shape, Tessera dtype and phase. Exits 1, naming
every mismatch, if anything differs.
"""
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import safetensors
import zarr
from safetensors import safe_open

# Tessera dtype -> numpy dtype of the values as stored (bf16: its raw bits).
NUMPY_DTYPES = {
    "f32": np.float32, "f64": np.float64, "f16": np.float16, "bf16": np.uint16,
    "i32": np.int32, "i64": np.int64, "u8": np.uint8, "b8": np.bool_,
}
SAFETENSORS_DTYPES = {
    "f32": "F32", "f64": "F64", "f16": "F16", "bf16": "BF16",
    "i32": "I32", "i64": "I64", "u8": "U8", "b8": "BOOL",
}
SHARD_NAME = re.compile(r"model-(\d{5})-of-(\d{5})\.safetensors")


def bf16_bits(f32):
    """float32 -> bfloat16 bits, round to nearest even on the uint32 view, as Tessera rounds
    (finite values only: sin gives no NaN)."""
    x = f32.view(np.uint32).astype(np.uint64)  # room for the carry
    return ((x + 0x7FFF + ((x >> 16) & 1)) >> 16).astype(np.uint16)


def expected(shape, phase, dtype):
    """v[i] = sin(0.61 * i + phase) in float64 over the row-major flat index, converted as
    Tensor::to converts it."""
    # math.sin is the C library's sin, the one Tessera's sin kernel calls (std::sin); numpy's
    # vectorized np.sin may differ from it in the last bit.
    v = np.array([math.sin(0.61 * i + phase) for i in range(math.prod(shape))], dtype=np.float64)
    v = v.reshape(shape)
    if dtype == "f64":
        return v
    if dtype == "f32":
        return v.astype(np.float32)
    if dtype == "f16":  # through float32, as Tessera converts: two roundings, not one
        return v.astype(np.float32).astype(np.float16)
    if dtype == "bf16":
        return bf16_bits(v.astype(np.float32))
    if dtype in ("i32", "i64", "u8"):
        return np.trunc((v + 1.0) * 50.0).astype(NUMPY_DTYPES[dtype])
    if dtype == "b8":
        return v > 0
    raise ValueError(f"unknown dtype {dtype}")


class Checker:
    def __init__(self):
        self.failures = []
        self.checked = 0

    def fail(self, message):
        self.failures.append(message)
        print(f"MISMATCH {message}")

    def same(self, label, got, want):
        """Exactly equal: the same dtype and shape, floats bit for bit."""
        got = np.asarray(got)
        if got.dtype != want.dtype or got.shape != want.shape:
            self.fail(f"{label}: {got.dtype} {list(got.shape)}; expected {want.dtype} {list(want.shape)}")
            return False
        if want.dtype.kind == "f":  # bits, so that -0.0 and NaN payloads count too
            bits = np.dtype(f"u{want.dtype.itemsize}")
            different = got.view(bits) != want.view(bits)
        else:
            different = got != want
        if np.any(different):
            index = tuple(int(i) for i in np.argwhere(different)[0])
            self.fail(f"{label}: {int(np.count_nonzero(different))} of {want.size} elements differ; "
                      f"at {list(index)}: {got[index]!r}, expected {want[index]!r}")
            return False
        self.checked += 1
        return True


def check_zarr(checker, root, arrays):
    group = zarr.open_group(str(root), mode="r")
    names = sorted(group.array_keys())
    if names != sorted(arrays):
        checker.fail(f"zarr group {root} holds {names}; expected {sorted(arrays)}")
    for name, spec in arrays.items():
        if name not in names:
            continue
        array = group[name]
        want = expected(tuple(spec["shape"]), spec["phase"], spec["dtype"])
        label = f"zarr {name} ({spec['layout']})"
        if spec["dtype"] == "bf16":  # no Zarr v3 core type: uint16 bits, named in the attributes
            tessera = dict(array.attrs).get("tessera", {})
            if tessera.get("dtype") != "bfloat16":
                checker.fail(f"{label}: attributes['tessera']['dtype'] is {tessera.get('dtype')!r}; expected 'bfloat16'")
        if checker.same(label, array[...], want):
            print(f"ok  {label}: {list(want.shape)} {spec['dtype']}, every element equal")


def load_safetensors(path):
    """({name: ndarray}, {name: safetensors dtype}, metadata) of one file, read by the safetensors
    package. numpy has no bfloat16 (safetensors.numpy.load_file and get_tensor refuse BF16), so
    BF16 tensors come as their uint16 bits from safetensors.deserialize, the package's own parser;
    every other dtype through safe_open(framework="numpy")."""
    tensors, dtypes = {}, {}
    with safe_open(str(path), framework="numpy") as f:
        metadata = f.metadata()
        for name in f.keys():
            dtypes[name] = f.get_slice(name).get_dtype()
            if dtypes[name] != "BF16":
                tensors[name] = f.get_tensor(name)
    if "BF16" in dtypes.values():
        for name, info in safetensors.deserialize(path.read_bytes()):
            if info["dtype"] == "BF16":
                tensors[name] = np.frombuffer(bytes(info["data"]), dtype="<u2").reshape(info["shape"])
    return tensors, dtypes, metadata


def check_safetensors_file(checker, path, arrays, names, metadata):
    """The file holds exactly `names`, each with its dtype and values, and the metadata."""
    tensors, dtypes, got_metadata = load_safetensors(path)
    if sorted(tensors) != sorted(names):
        checker.fail(f"{path} holds {sorted(tensors)}; expected {sorted(names)}")
    if got_metadata != metadata:
        checker.fail(f"{path}: metadata {got_metadata}; expected {metadata}")
    for name in names:
        if name not in tensors:
            continue
        spec = arrays[name]
        label = f"{path.parent.name}/{path.name} {name}"
        if dtypes[name] != SAFETENSORS_DTYPES[spec["dtype"]]:
            checker.fail(f"{label}: dtype {dtypes[name]}; expected {SAFETENSORS_DTYPES[spec['dtype']]}")
        if checker.same(label, tensors[name], expected(tuple(spec["shape"]), spec["phase"], spec["dtype"])):
            print(f"ok  {label}: {spec['shape']} {dtypes[name]}, every element equal")
    return tensors


def check_split(checker, root, arrays, names, metadata, max_file_bytes):
    index = json.loads((root / "model.safetensors.index.json").read_text())
    weight_map = index["weight_map"]
    if sorted(weight_map) != sorted(names):
        checker.fail(f"{root}: the index's weight_map names {sorted(weight_map)}; expected {sorted(names)}")
    total = sum(expected(tuple(arrays[n]["shape"]), arrays[n]["phase"], arrays[n]["dtype"]).nbytes for n in names)
    if index["metadata"]["total_size"] != total:
        checker.fail(f"{root}: total_size {index['metadata']['total_size']}; expected {total}")
    files = sorted(set(weight_map.values()))
    for number, file in enumerate(files, start=1):
        match = SHARD_NAME.fullmatch(file)
        if not match or int(match.group(1)) != number or int(match.group(2)) != len(files):
            checker.fail(f"{root}: file {file} is not model-{number:05d}-of-{len(files):05d}.safetensors")
    if len(files) < 2:
        checker.fail(f"{root}: {len(files)} file(s); the writer's max_file_bytes should give several")
    for file in files:
        held = [n for n, f in weight_map.items() if f == file]
        tensors = check_safetensors_file(checker, root / file, arrays, held, metadata)
        size = sum(t.nbytes for t in tensors.values())
        if size > max_file_bytes and len(held) > 1:
            checker.fail(f"{root / file}: {size} tensor bytes in {len(held)} tensors; at most {max_file_bytes} unless one")
    on_disk = sorted(p.name for p in root.iterdir())
    if on_disk != sorted(files + ["model.safetensors.index.json"]):
        checker.fail(f"{root} holds {on_disk}; expected the {len(files)} shards and the index only")
    print(f"ok  {root.name}: {len(files)} files, the index names all {len(names)} tensors, total_size {total}")


def main():
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} <writer output directory>")
    out = Path(sys.argv[1])
    manifest = json.loads((out / "manifest.json").read_text())
    arrays = {spec["name"]: spec for spec in manifest["zarr"]}
    exported = manifest["safetensors"]
    metadata = manifest["metadata"]
    print(f"zarr {zarr.__version__}, safetensors {safetensors.__version__}, numpy {np.__version__}")

    checker = Checker()
    check_zarr(checker, out / "zarr", arrays)
    check_zarr(checker, out / "zarr-zstd", arrays)
    codecs = json.loads((out / "zarr-zstd" / next(iter(arrays)) / "zarr.json").read_text())["codecs"]
    if [c["name"] for c in codecs] != ["bytes", "zstd"]:
        checker.fail(f"zarr-zstd's codecs are {codecs}; expected bytes then zstd")
    one_file = out / "st"
    check_safetensors_file(checker, one_file / "model.safetensors", arrays, exported, metadata)
    if sorted(p.name for p in one_file.iterdir()) != ["model.safetensors"]:
        checker.fail(f"{one_file} holds {sorted(p.name for p in one_file.iterdir())}; expected model.safetensors only")
    check_split(checker, out / "st-split", arrays, exported, metadata, manifest["max_file_bytes"])

    if checker.failures:
        print(f"check_checkpoint: FAILED: {len(checker.failures)} mismatch(es):", file=sys.stderr)
        for failure in checker.failures:
            print(f"  {failure}", file=sys.stderr)
        sys.exit(1)
    print(f"check_checkpoint: {checker.checked} arrays read by zarr-python and safetensors equal numpy's values")


if __name__ == "__main__":
    main()

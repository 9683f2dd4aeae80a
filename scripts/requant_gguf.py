#!/usr/bin/env python3
"""Rewrites a GGUF model with its weight matrices in another block format, to
exercise the Q3_K / Q5_K / IQ4_NL / IQ4_XS readers and kernels on a real
model. Not part of the build or the tests; a measurement tool.

Every 2-D tensor whose rows the target format's block size divides (and that
is not the token embedding) is dequantised with the `gguf` package and
quantised with OUR reference quantiser (scripts/fixtures/quantize_blocks.cpp,
compiled on the fly against src/core/dtype.cpp; needs a C++20 compiler and
libfmt); every other tensor and all metadata are copied unchanged. The file is
written by the gguf package's own GGUFWriter, so it is an independently
written GGUF.

Usage: requant_gguf.py IN.gguf OUT.gguf FORMAT   (FORMAT: q3_k, q5_k, iq4_nl,
       iq4_xs, or any format name of ours that GGML also knows)
Needs: pip install gguf numpy
"""

import pathlib
import subprocess
import sys
import tempfile

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

REPO = pathlib.Path(__file__).resolve().parents[1]


def build_quantiser() -> pathlib.Path:
    exe = pathlib.Path(tempfile.mkdtemp()) / "quantize_blocks"
    subprocess.run(["c++", "-std=c++20", "-O2", f"-I{REPO / 'src'}", str(REPO / "scripts/fixtures/quantize_blocks.cpp"),
                    str(REPO / "src/core/dtype.cpp"), str(REPO / "src/core/error.cpp"), "-lfmt", "-o", str(exe)],
                   check=True)
    return exe


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    src, dst, fmt = sys.argv[1], sys.argv[2], sys.argv[3].lower()
    target = T[fmt.upper()]
    block, _ = GGML_QUANT_SIZES[target]
    exe = build_quantiser()
    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(dst, arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub)
    converted = kept = 0
    for t in reader.tensors:
        shape = [int(d) for d in t.shape]  # GGUF order: shape[0] is the row length
        convert = len(shape) == 2 and shape[0] % block == 0 and t.name != "token_embd.weight"
        if not convert:
            writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
            kept += 1
            continue
        values = quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
        out = subprocess.run([str(exe), fmt, str(values.size)], input=values.tobytes(), capture_output=True, check=True)
        rows = values.size // shape[0]
        raw = np.frombuffer(out.stdout, dtype=np.uint8).reshape(rows, -1)
        writer.add_tensor(t.name, raw, raw_dtype=target)
        converted += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"wrote {dst}: {converted} tensors as {fmt}, {kept} kept")


if __name__ == "__main__":
    main()

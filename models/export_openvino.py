"""Export the passkey model to OpenVINO: an openvino-genai model folder (IR + tokenizer).

Primitives:
- ``export_openvino(gguf_path, out_dir) -> Path``: the IR (built with the project's opset converter,
  ``kvres.actors.engines.openvino``, from the GGUF's weights), ``openvino_tokenizer.xml`` /
  ``openvino_detokenizer.xml`` from the GGUF vocabulary, ``config.json`` and
  ``generation_config.json``: a folder ``openvino_genai.LLMPipeline`` and
  ``ContinuousBatchingPipeline`` load, and ``OpenVINOExecutor`` too.
- ``canonical_layer_names(xml_text) -> str``: OpenVINO numbers the layers it names itself from a
  process-wide counter ("Constant_617"); renumbering them in order of appearance makes the same
  weights give the same bytes, so the committed folder can be checked by re-exporting.
- CLI: ``python models/export_openvino.py [--gguf models/passkey.gguf] [--out models/openvino]``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make "models" importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

HERE = Path(__file__).resolve().parent
_AUTO_NAME = re.compile(r'(<layer id="\d+" name=")([A-Za-z]+)_(\d+)(")')


def canonical_layer_names(xml_text: str) -> str:
    counters: dict[str, int] = defaultdict(int)
    renamed: dict[str, str] = {}

    def rename(match: re.Match[str]) -> str:
        original = f"{match.group(2)}_{match.group(3)}"
        if original not in renamed:
            renamed[original] = f"{match.group(2)}_k{counters[match.group(2)]}"
            counters[match.group(2)] += 1
        return f"{match.group(1)}{renamed[original]}{match.group(4)}"

    return _AUTO_NAME.sub(rename, xml_text)


def export_openvino(gguf_path: Path, out_dir: Path) -> Path:
    from kvres.actors.engines.openvino import export_genai_model

    with tempfile.TemporaryDirectory() as tmp:
        folder = export_genai_model(gguf_path, Path(tmp) / "ov")
        out_dir.mkdir(parents=True, exist_ok=True)
        for src in sorted(folder.iterdir()):
            if src.suffix == ".xml":
                (out_dir / src.name).write_text(canonical_layer_names(src.read_text()))
            else:
                shutil.copyfile(src, out_dir / src.name)
    return out_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, default=HERE / "passkey.gguf")
    parser.add_argument("--out", type=Path, default=HERE / "openvino")
    args = parser.parse_args(argv)
    print(export_openvino(args.gguf, args.out))


if __name__ == "__main__":
    main()

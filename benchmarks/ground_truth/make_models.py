"""Make the ground-truth models: real MoE architectures at reduced width and depth, random
weights, saved by transformers, converted by llama.cpp's own converter and quantized by its
llama-quantize (f16, Q8_0, Q4_K_M). Nothing is downloaded: the tokenizer is a small byte-level
BPE trained here on this file's own text.

Run with a venv that has torch (CPU), transformers 4.57.x (llama.cpp's requirements pin) and
tokenizers:  python make_models.py --llama-cpp DIR --out DIR
The configs are committed beside this file (configs/*.json): `hrm` reads the same files, so a
prediction and its measurement are of one model.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIGS = HERE / "configs"
#: the converter refuses a BPE tokenizer whose pre-tokenizer hash it does not know; these are
#: known names of the same byte-level family (convert_hf_to_gguf.py get_vocab_base_pre)
TOKENIZER_PRE = {"mixtral": "gpt-2", "qwen3_moe": "qwen2", "deepseek_v2": "gpt-2"}
FORMATS = ("f16", "q8_0", "q4_k_m")
VOCAB = 1024


def train_tokenizer(out: Path) -> None:
    """A byte-level BPE with merges (llama.cpp will not load a BPE vocab without them)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<s>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = Path(__file__).read_text() * 4 + (HERE.parent.parent / "README.md").read_text()
    tok.train_from_iterator(text.splitlines(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(out)


def save_random(config_path: Path, out: Path) -> str:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    conf = json.loads(config_path.read_text())
    conf = {k: v for k, v in conf.items() if not k.startswith("_")}
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(conf))
    config = AutoConfig.from_pretrained(out)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float16)
    model.save_pretrained(out, safe_serialization=True)
    train_tokenizer(out)
    return conf["model_type"]


CONVERT = """
import os, sys
sys.path.insert(0, os.environ['LCPP_DIR'])
sys.argv[0] = os.path.join(os.environ['LCPP_DIR'], 'convert_hf_to_gguf.py')
import convert_hf_to_gguf as c
from conversion.base import TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: os.environ['TOKPRE']
c.main()
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-cpp", required=True, type=Path, help="llama.cpp source tree with build/bin")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--only", default="", help="comma-separated config names")
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n] or sorted(p.stem for p in CONFIGS.glob("*.json"))
    for name in names:
        hf = args.out / "hf" / name
        if not (hf / "model.safetensors").exists():
            model_type = save_random(CONFIGS / f"{name}.json", hf)
        else:
            model_type = json.loads((hf / "config.json").read_text())["model_type"]
        f16 = args.out / f"{name}-f16.gguf"
        if not f16.exists():
            env = dict(os.environ, LCPP_DIR=str(args.llama_cpp), TOKPRE=TOKENIZER_PRE[model_type])
            subprocess.run([sys.executable, "-c", CONVERT, str(hf), "--outtype", "f16", "--outfile", str(f16)],
                           env=env, check=True)
        for fmt in FORMATS[1:]:
            q = args.out / f"{name}-{fmt}.gguf"
            if not q.exists():
                subprocess.run([str(args.llama_cpp / "build/bin/llama-quantize"), str(f16), str(q), fmt.upper()],
                               check=True, stdout=subprocess.DEVNULL)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""Check an exported model folder's tokenizer with transformers' AutoTokenizer against tetrad.

    scripts/hf_tokenizer_check.py MODEL_DIR TEXT.txt TETRAD_IDS.txt TETRAD_DECODED.txt

TEXT.txt            the input, one case per line (split at '\\n', a trailing '\\r' dropped, no
                    line after a final '\\n'; invalid UTF-8 decoded with errors="replace", as
                    tetrad does, since the library takes only str)
TETRAD_IDS.txt      `tetrad tokenize --tokenizer MODEL_DIR < TEXT.txt`
TETRAD_DECODED.txt  `tetrad tokenize --tokenizer MODEL_DIR --decode < TETRAD_IDS.txt`

For every line: AutoTokenizer.from_pretrained(MODEL_DIR).encode(line, add_special_tokens=False)
must equal tetrad's ids, and its decode of those ids (skip_special_tokens=False) must equal
tetrad's decode. Prints the tokenizer class, the lines and ids compared and the first mismatch;
exits 0 when all agree, 1 when not, 2 when the inputs are unusable. Not part of CTest (needs
transformers); scripts/check-hf-parity.sh runs it.

A folder with a SentencePiece tokenizer.model is compared with the sentencepiece library itself
(SentencePieceProcessor.encode / decode, what made the model and what transformers 4.x's
LlamaTokenizer runs), which decides the exit status; AutoTokenizer's agreement is printed
beside it, because transformers 5 no longer runs sentencepiece for LlamaTokenizer but converts the
model into a tokenizers BPE with a Metaspace pre-tokenizer, which splits runs of spaces
differently.
"""
import sys


def fail(msg):
    print(f"hf_tokenizer_check: {msg}", file=sys.stderr)
    sys.exit(2)


def lines_of(data):
    raw = data.split(b"\n")
    if raw and raw[-1] == b"":
        raw.pop()
    return [l[:-1] if l.endswith(b"\r") else l for l in raw]


def main():
    if len(sys.argv) != 5:
        fail(__doc__.strip().split("\n\n")[1])
    model_dir, text_path, ids_path, dec_path = sys.argv[1:]
    try:
        from transformers import AutoTokenizer
    except ImportError as e:
        fail(f"{e}; install transformers (see scripts/check-hf-parity.sh)")
    tok = AutoTokenizer.from_pretrained(model_dir)
    with open(text_path, "rb") as f:
        texts = [l.decode("utf-8", errors="replace") for l in lines_of(f.read())]
    with open(ids_path, "rb") as f:
        tetrad_ids = [[int(t) for t in l.split()] for l in lines_of(f.read())]
    with open(dec_path, "rb") as f:
        tetrad_dec = [l.decode("utf-8", errors="replace") for l in lines_of(f.read())]
    if len(tetrad_ids) != len(texts) or len(tetrad_dec) != len(texts):
        fail(f"{len(texts)} input lines but {len(tetrad_ids)} id lines and {len(tetrad_dec)} "
             "decoded lines")
    import os
    sp_path = os.path.join(model_dir, "tokenizer.model")
    has_json = os.path.exists(os.path.join(model_dir, "tokenizer.json"))
    libs = [(type(tok).__name__, lambda t: tok.encode(t, add_special_tokens=False),
             lambda ids: tok.decode(ids, skip_special_tokens=False))]
    if os.path.exists(sp_path) and not has_json:
        try:
            import sentencepiece as spm
        except ImportError as e:
            fail(f"{e}; install sentencepiece")
        sp = spm.SentencePieceProcessor(model_file=sp_path)
        libs.insert(0, ("sentencepiece", sp.encode, sp.decode))
    status = 0
    for k, (name, encode, decode) in enumerate(libs):
        same_ids = same_dec = n_ids = 0
        first = None
        for i, (text, ids, dec) in enumerate(zip(texts, tetrad_ids, tetrad_dec)):
            hf_ids = encode(text)
            hf_dec = decode(ids)
            n_ids += len(hf_ids)
            same_ids += hf_ids == ids
            same_dec += hf_dec == dec
            if first is None and (hf_ids != ids or hf_dec != dec):
                first = (f"line {i + 1} {text!r}: {name} {hf_ids} decodes {hf_dec!r}; "
                         f"tetrad {ids} decodes {dec!r}")
        deciding = k == 0
        print(f"{name} from {model_dir}: {len(texts)} lines of {text_path}, {n_ids} ids; "
              f"ids identical on {same_ids}/{len(texts)} lines, decode identical on "
              f"{same_dec}/{len(texts)}{'' if deciding else ' (for information)'}")
        if first is not None:
            print(f"{'FAIL' if deciding else 'differs'}: first difference: {first}")
            status = status or (1 if deciding else 0)
        elif deciding:
            print(f"OK: {n_ids} ids identical")
    return status


if __name__ == "__main__":
    sys.exit(main())
